"""The update promise off the happy path, against the real engine: partial
updates, pieces of fused parameters, failures half-way through a load, calls
waiting when an apply fails, slow readers, drain deadlines, retries.

After an acknowledgement the output equals a fresh engine started on the
same weights (tokens and logprobs); anything else is refused before the
engine is touched, or leaves the server degraded and saying so."""

from __future__ import annotations

import random
import threading
import time

import grpc
import pytest
import torch

from harness.weights_util import (
    full_stream,
    random_weights,
    version,
)
from rollout.v1 import rollout_pb2_grpc
from rollout_client import RolloutClient, RolloutError, pb
from rollout_client.weights.push import ManifestMismatch
from tests.support import weights_reference

# Longer than two 128-token KV blocks: most of it comes from the prefix cache.
PROMPT = [random.Random(7).randrange(10, 500) for _ in range(300)]
Q0 = "model.layers.0.self_attn.q_proj.weight"
GATE1 = "model.layers.1.mlp.gate_proj.weight"


def greedy(client, prompt=PROMPT, max_tokens=16):
    r = client.generate(prompt_token_ids=prompt, max_tokens=max_tokens, temperature=0)
    c = r.completions[0]
    return list(c.token_ids), list(c.logprobs)


def assert_same_output(got, want):
    assert got[0] == want[0]
    assert got[1] == pytest.approx(want[1], abs=1e-6)


def _group(info, member: str) -> list[str]:
    for g in info.parameter_groups:
        if member in g.names:
            return list(g.names)
    return [member]


@pytest.fixture(scope="module")
def pushed():
    """Known full weights, pushed before each comparison, and a partial
    update over them (tests/support/weights_reference.py)."""
    return weights_reference.promise_weights()


@pytest.fixture(scope="module")
def base(pushed):
    return pushed[0]


@pytest.fixture(scope="module")
def partial(pushed):
    return pushed[1]


@pytest.fixture(scope="module")
def fresh(promise_reference_server):
    """A fresh engine on base + partial, with norms stored as float32."""
    with RolloutClient(promise_reference_server.target, timeout=120) as c:
        yield c


def test_the_pushed_weights_are_the_whole_model_and_whole_groups(info, base, partial):
    # Every tensor the server lists; the partial update is whole groups only:
    # layer 0's fused q/k/v (weights and biases), layer 1's fused gate/up, and
    # a norm that travels alone.
    assert set(base) == {p.name for p in info.parameters}
    assert set(partial) == {*_group(info, Q0), *_group(info, GATE1), "model.norm.weight"}


def test_the_model_declares_its_fused_groups(info):
    groups = {g.module: sorted(g.names) for g in info.parameter_groups}
    prefix = "model.layers.0.self_attn."
    assert groups[prefix + "qkv_proj"] == sorted(
        prefix + f"{p}_proj.{k}" for p in "qkv" for k in ("weight", "bias")
    )
    assert sorted(groups["model.layers.1.mlp.gate_up_proj"]) == [
        GATE1,
        "model.layers.1.mlp.up_proj.weight",
    ]
    grouped = {n for g in info.parameter_groups for n in g.names}
    assert "model.layers.0.self_attn.o_proj.weight" not in grouped  # travels alone


def test_a_subset_of_whole_groups_equals_a_fresh_engine(client, base, partial, fresh):
    client.update_weights(base, version())
    greedy(client)  # fill the prefix cache under base
    ack = client.update_weights(partial, version())
    assert ack.tensors_loaded == len(partial)
    assert_same_output(greedy(client), greedy(fresh))


def test_a_piece_of_a_fused_group_is_refused_before_the_engine(client, info):
    before = client.server_info().weight_version, greedy(client)
    pieces = random_weights([p for p in info.parameters if p.name in (Q0, GATE1)], seed=5)
    with pytest.raises(RolloutError) as e:
        client.update_weights(pieces, version())
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value.details
    for companion in ("layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight"):
        assert companion in e.value.details
    assert (client.server_info().weight_version, greedy(client)) == before


def test_the_manifest_lists_each_tensors_own_dtype(fresh, base, partial):
    info = fresh.server_info()
    dtypes = {p.name: p.dtype for p in info.parameters}
    assert dtypes["model.norm.weight"] == pb.D_TYPE_FLOAT32
    assert dtypes["model.layers.0.input_layernorm.weight"] == pb.D_TYPE_FLOAT32
    assert dtypes[Q0] == pb.D_TYPE_BFLOAT16
    before = greedy(fresh)
    # The same weights again, each in its own dtype: accepted, output unchanged.
    same = {
        n: t.float() if dtypes[n] == pb.D_TYPE_FLOAT32 else t
        for n, t in {**base, **partial}.items()
    }
    fresh.update_weights(same, version())
    assert_same_output(greedy(fresh), before)
    # A norm in bf16 is not what this server takes: the client says so first.
    with pytest.raises(ManifestMismatch, match="FLOAT32"):
        fresh.update_weights({"model.norm.weight": partial["model.norm.weight"]}, version())


def test_a_failure_half_way_through_a_load_degrades_then_a_full_update_recovers(
    client, info, fault_file, base, partial, fresh
):
    failing = random_weights(info.parameters, seed=1003)
    # Fail inside load_weights after layer 0 is loaded and in the middle of
    # layer 1's fused q/k/v: some layers new, one half-buffered, the rest old.
    after = list(failing).index("model.layers.1.self_attn.k_proj.weight")
    fault_file.write_text(str(after))
    try:
        with pytest.raises(RolloutError) as e:
            client.update_weights(failing, version())
    finally:
        fault_file.unlink()
    assert e.value.code == grpc.StatusCode.INTERNAL and "degraded" in e.value.details
    s = client.server_info()
    assert s.degraded and s.weight_version == "", "no version is claimed for mixed weights"
    with pytest.raises(RolloutError) as e:
        greedy(client)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION

    ack = client.update_weights({**base, **partial}, version())
    assert not client.server_info().degraded
    assert client.server_info().weight_version == ack.weight_version
    assert_same_output(greedy(client), greedy(fresh))


def _long_call(client, results, key, **kw):
    def run():
        try:
            r = client.generate(prompt_token_ids=[5, 6, 7], ignore_eos=True, temperature=0, **kw)
            results[key] = r
        except RolloutError as e:
            results[key] = e

    t = threading.Thread(target=run)
    t.start()
    return t


def _wait_engine_requests(client, n, timeout=20):
    deadline = time.monotonic() + timeout
    while client.server_info().engine_requests < n:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_calls_waiting_at_the_gate_when_an_apply_fails_are_refused(client, info, fault_file, base):
    results = {}
    threads = [_long_call(client, results, "in-flight", max_tokens=500)]
    _wait_engine_requests(client, 1)
    fault_file.write_text("0")
    try:
        head = [p for p in info.parameters if p.name == "lm_head.weight"]

        def update():
            try:
                results["update"] = client.update_weights(random_weights(head, seed=9), version())
            except RolloutError as e:
                results["update"] = e

        updater = threading.Thread(target=update)
        updater.start()
        time.sleep(0.3)  # the update is draining: these two wait at the gate
        threads += [_long_call(client, results, f"waiting-{i}", max_tokens=4) for i in range(2)]
        for t in [*threads, updater]:
            t.join(120)
    finally:
        fault_file.unlink()
    assert isinstance(results["update"], RolloutError) and "degraded" in results["update"].details
    assert isinstance(results["in-flight"], pb.GenerateResponse)  # finished on the old weights
    for i in range(2):
        r = results[f"waiting-{i}"]
        assert isinstance(r, RolloutError), f"a waiting call ran on the failed engine: {r}"
        assert r.code == grpc.StatusCode.FAILED_PRECONDITION and "degraded" in r.details
    client.update_weights(base, version())  # recover
    assert not client.server_info().degraded


def test_a_slow_stream_reader_does_not_hold_an_update_back(server, client, base):
    old = client.server_info().weight_version
    # A reader that does not read, on a channel whose flow-control window
    # stays small (no BDP probing): the server's writes of these large
    # deltas (20 alternatives per token) block long before the last one.
    with grpc.insecure_channel(server.target, options=[("grpc.http2.bdp_probe", 0)]) as ch:
        stream = rollout_pb2_grpc.RolloutServiceStub(ch).GenerateStream(
            pb.GenerateStreamRequest(
                prompt_token_ids=[9, 8, 7],
                sampling_params=pb.SamplingParams(
                    max_tokens=1500, ignore_eos=True, temperature=0, logprobs=20
                ),
            ),
            timeout=120,
        )
        first = next(stream)
        deadline = time.monotonic() + 60
        while client.server_info().engine_requests:  # the engine finishes regardless
            assert time.monotonic() < deadline
            time.sleep(0.05)
        t0 = time.monotonic()
        ack = client.update_weights(base, version(), timeout=30)
        assert time.monotonic() - t0 < 20
        assert ack.requests_aborted == 0
        deltas = [first, *stream]
    assert sum(len(d.token_ids) for d in deltas) == 1500
    assert {d.weight_version for d in deltas} == {old}
    assert deltas[-1].finish_reason == pb.FINISH_REASON_LENGTH


def test_the_drain_deadline_aborts_stragglers_and_the_update_goes_on(client, base):
    old = client.server_info().weight_version
    assert client.server_info().drain_timeout_seconds == 120
    results = {}
    t = _long_call(client, results, "long", max_tokens=1900)
    _wait_engine_requests(client, 1)
    t0 = time.monotonic()
    ack = client.update_weights(base, version(), drain_timeout_seconds=0.5)
    assert time.monotonic() - t0 < 10
    t.join(60)
    assert ack.requests_aborted == 1
    c = results["long"].completions[0]
    assert c.finish_reason == pb.FINISH_REASON_ABORT and 0 < len(c.token_ids) < 1900
    assert results["long"].weight_version == old


def test_a_retry_after_cancelling_past_commit_gets_the_original_ack(server, client, info):
    weights = random_weights(info.parameters, seed=1004)
    v = version()
    previous = client.server_info().weight_version
    results = {}
    # An in-flight call holds the apply in its drain, so the cancel below
    # lands after the server has the commit and before the ack.
    t = _long_call(client, results, "in-flight", max_tokens=1500)
    _wait_engine_requests(client, 1)
    committed = threading.Event()

    def stream():
        yield from full_stream(weights, v)
        committed.set()
        time.sleep(5)  # keep the request stream open; the call is cancelled meanwhile

    with grpc.insecure_channel(server.target) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        future = stub.UpdateWeights.future(stream(), timeout=60)
        assert committed.wait(30)
        time.sleep(0.3)
        future.cancel()
        with pytest.raises(grpc.FutureCancelledError):
            future.result()
    t.join(60)
    deadline = time.monotonic() + 30
    while client.server_info().weight_version != v:  # it applied anyway
        assert time.monotonic() < deadline
        time.sleep(0.05)

    ack = client.update_weights(weights, v)
    assert ack.replayed and ack.weight_version == v and ack.previous_weight_version == previous
    other = {**weights, "lm_head.weight": weights["lm_head.weight"] * 2}
    with pytest.raises(RolloutError) as e:  # the same version with other bytes
        client.update_weights(other, v)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "differ" in e.value.details
    assert client.server_info().weight_version == v


def test_tensor_views_of_0d_and_empty_tensors():
    """The worker-side views for tensors a real checkpoint may hold (no engine)."""
    from rollout_service.handoff.staged_tensor import StagedTensor
    from rollout_service.worker.weights_backend import tensor_view

    buf = bytearray(64)
    scale = torch.tensor(0.5, dtype=torch.float32)
    buf[0:4] = scale.reshape(1).view(torch.uint8).numpy().tobytes()
    _, got = tensor_view(buf, StagedTensor("s", "float32", (), 0, 4))
    assert got.shape == () and got.item() == 0.5
    _, empty = tensor_view(buf, StagedTensor("e", "int64", (0, 3), 64, 0))
    assert empty.shape == (0, 3) and empty.dtype == torch.int64
    buf[8:16] = torch.tensor([7], dtype=torch.int64).view(torch.uint8).numpy().tobytes()
    _, ints = tensor_view(buf, StagedTensor("i", "int64", (1,), 8, 8))
    assert ints.tolist() == [7]
