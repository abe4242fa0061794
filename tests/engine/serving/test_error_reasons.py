"""Every status the service makes carries a documented ErrorInfo reason, and
RolloutError exposes it: real refusals from the real server, one per reason
that the session server can produce (auth, limits and queue reasons:
tests/engine/serving/test_hardening.py; ENGINE_FAILURE and DEGRADED:
tests/engine/weights/test_weights.py)."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from harness.weights_util import random_weights, version
from rollout_client import RolloutError, pb


def reason_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(RolloutError) as e:
        call()
    assert pb.ErrorReason.Value("ERROR_REASON_" + e.value.reason), "documented in the proto"
    return e.value.code, e.value.reason


def test_bad_input_is_invalid_field(client):
    assert reason_of(lambda: client.generate(prompt_text="x", top_p=3.0)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
    )
    assert reason_of(lambda: client.detokenize([10**7]))[1] == "INVALID_FIELD"


def test_a_served_version_with_other_bytes_is_version_already_served(client, info):
    head = [p for p in info.parameters if p.name == "lm_head.weight"]
    v = version()
    client.update_weights(random_weights(head, seed=21), v)
    assert reason_of(lambda: client.update_weights(random_weights(head, seed=22), v)) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "VERSION_ALREADY_SERVED",
    )


def test_staged_update_conflicts_have_their_reasons(client, info):
    head = [p for p in info.parameters if p.name == "lm_head.weight"]
    begin = pb.UpdateWeightsBegin(weight_version=version(), tensors=head)
    opened = client.stub.BeginUpdate(pb.BeginUpdateRequest(begin=begin))
    try:
        other = pb.BeginUpdateRequest(
            begin=pb.UpdateWeightsBegin(weight_version=version(), tensors=head)
        )
        assert reason_of(lambda: client._unary(client.stub.BeginUpdate, other, None)) == (
            grpc.StatusCode.ABORTED,
            "UPDATE_IN_PROGRESS",
        )
    finally:
        client.stub.AbortUpdate(pb.AbortUpdateRequest(update_id=opened.update_id))
    status = pb.GetUpdateStatusRequest(update_id=opened.update_id)
    assert reason_of(lambda: client._unary(client.stub.GetUpdateStatus, status, None)) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "UPDATE_NOT_OPEN",
    )


def test_sleep_where_there_is_none_is_sleep_unavailable(client):
    assert reason_of(lambda: client.sleep(1)) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "SLEEP_UNAVAILABLE",
    )


def test_abort_and_tokenize_through_the_client(client):
    out = {}

    def run():
        out["r"] = client.generate(
            request_id="client-abort", prompt_token_ids=[1, 2, 3], max_tokens=1500, ignore_eos=True
        )

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.5)
    assert list(client.abort(["client-abort"]).request_ids) == ["client-abort"]
    t.join(60)
    assert out["r"].completions[0].finish_reason == pb.FINISH_REASON_ABORT
    messages = [{"role": "user", "content": "Name a color."}]
    ids = client.tokenize(messages=messages).token_ids
    r = client.generate(messages=messages, max_tokens=4, temperature=0)
    assert list(r.prompt_token_ids) == list(ids)
    assert client.detokenize(ids).text.endswith("<|assistant|>\n")


def test_the_api_docs_table_every_reason_with_its_code():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "api.md").read_text()
    rows = {
        cells[1].strip("` "): cells[2].strip()
        for line in text.splitlines()
        if line.startswith("| `") and len(cells := line.split("|")) > 3
    }
    documented = {n.removeprefix("ERROR_REASON_") for n in pb.ErrorReason.keys()} - {"UNSPECIFIED"}
    assert documented <= rows.keys(), f"not in docs/api.md: {sorted(documented - rows.keys())}"
    assert rows["DELTA_BASE_MISMATCH"] == "FAILED_PRECONDITION"
