"""PAUSE_MODE_KEEP against the real engine: requests running when an update
applies are not drained or aborted; they continue on the new weights, every
token tagged with the version that produced it, and what they generate after
the switch is exactly what a fresh request on the new weights generates from
their prompt and the tokens so far (their KV cache was recomputed, not kept)."""

from __future__ import annotations

import threading
import time

from harness.weights_util import random_weights, version
from rollout_client import pb
from tests.support.keep_mode import PROMPT, fresh_continuation, merged_spans


def test_a_kept_stream_continues_on_the_new_weights(client, info):
    old = client.server_info().weight_version
    weights = random_weights(info.parameters, seed=11)
    msgs: list[tuple[float, pb.GenerateStreamResponse]] = []

    def run():
        for m in client.generate_stream(
            prompt_token_ids=PROMPT, max_tokens=800, temperature=0, ignore_eos=True
        ):
            msgs.append((time.monotonic(), m))

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 60
    while sum(len(m.token_ids) for _, m in msgs) < 40 and time.monotonic() < deadline:
        time.sleep(0.002)
    new = version()
    ack = client.update_weights(weights, new, pause_mode=pb.PAUSE_MODE_KEEP)
    acked = time.monotonic()
    t.join(120)
    assert ack.requests_aborted == 0
    tokens = [tok for _, m in msgs for tok in m.token_ids]
    assert len(tokens) == 800 and msgs[-1][1].finish_reason == pb.FINISH_REASON_LENGTH
    runs = merged_spans([(m.version_spans, len(m.token_ids)) for _, m in msgs])
    assert [r[0] for r in runs] == [old, new], runs
    boundary = runs[1][1]
    assert 40 <= boundary < 800 and sum(r[2] for r in runs) == 800
    # every message after the acknowledgement carries only new-version tokens
    assert all({s.weight_version for s in m.version_spans} == {new} for at, m in msgs if at > acked)
    assert fresh_continuation(client, tokens, boundary) == tokens[boundary:]


def test_a_kept_unary_call_reports_both_versions(client, info):
    old = client.server_info().weight_version
    weights = random_weights(info.parameters, seed=12)
    out = {}
    t = threading.Thread(
        target=lambda: out.setdefault(
            "r",
            client.generate(
                prompt_token_ids=PROMPT, max_tokens=1500, temperature=0, ignore_eos=True
            ),
        )
    )
    t.start()
    time.sleep(0.4)
    new = version()
    client.update_weights(weights, new, pause_mode=pb.PAUSE_MODE_KEEP)
    t.join(120)
    r = out["r"]
    c = r.completions[0]
    assert r.weight_version == old, "the response's version is the one it was admitted on"
    runs = [(s.weight_version, s.start, s.count) for s in c.version_spans]
    assert [v for v, _, _ in runs] == [old, new], runs
    assert runs[0][1] == 0 and runs[1][1] == runs[0][2] and runs[0][2] + runs[1][2] == 1500
    tokens = list(c.token_ids)
    assert fresh_continuation(client, tokens, runs[1][1]) == tokens[runs[1][1] :]
    # a call that starts after the update runs on it alone
    after = client.generate(prompt_token_ids=PROMPT, max_tokens=4, temperature=0)
    assert [s.weight_version for s in after.completions[0].version_spans] == [new]
