"""update_weights(delta=True) against the real engine: the client picks the
cheaper way for each push from what its earlier pushes measured
(rollout_client/weights/delta_costs.py). A run whose share of changed values jumps
(a learning-rate spike: every value moves) falls back to full pushes (which
keep samples of what they pushed, not a copy), and goes back to deltas once
the share drops; every push, whichever way it went,
serves exactly what a full push of the same weights serves on a fresh engine
(the reference server, tests/conftest.py).

The automatic pushes go to the session server through a link of 4 MB/s
(tests/support/slow_link.py: a trainer on another host, where what a delta
saves shows; on loopback this tiny model's pushes cost about what one call
costs, either way); the delta reference server takes full pushes of the same
weights directly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.weights_util import version
from rollout_client import RolloutClient
from tests.support.delta_steps import initial
from tests.support.greedy import assert_same, served
from tests.support.slow_link import slow_link

LINK = 4e6  # bytes per second, trainer to server
# Changed values per step: a few in a hundred (a small learning rate), then
# every one (the spike), then a few again.
CALM, SPIKE = 0.02, 1.0
RUN = [CALM] * 4 + [SPIKE] * 3 + [CALM] * 4


def run_of(shares: list[float], seed: int = 40) -> list[dict[str, torch.Tensor]]:
    """bf16 weights after each step: the share `s` of each bf16 tensor's
    values moved by 2 % of their size (enough to change the bf16 value)."""
    g = torch.Generator().manual_seed(seed)
    w = {n: t.clone() for n, t in initial().items()}
    out = []
    for s in shares:
        for t in w.values():
            if t.dtype != torch.bfloat16:
                continue
            moved = torch.rand(t.shape, generator=g) < s
            step = 0.02 * t.float().abs().clamp_min(1e-3) * torch.randn(t.shape, generator=g).sign()
            t.copy_(torch.where(moved, t.float() + step, t.float()).to(t.dtype))
        out.append({n: t.clone() for n, t in w.items()})
    return out


@pytest.fixture(scope="module")
def client(server):
    with slow_link(server.target, LINK) as target, RolloutClient(target, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def reference(delta_reference):
    with RolloutClient(delta_reference.target, timeout=120) as c:
        yield c


def test_a_spike_goes_to_full_pushes_and_back_to_deltas_serving_what_a_fresh_engine_serves(
    client, reference
):
    weights = run_of([CALM, *RUN])
    client.update_weights(weights[0], version(), delta=True)  # the first: in full
    held = [client.pushed.nbytes]  # the client's copy of what it pushed, after each push
    for w in weights[1:]:
        ack = client.update_weights(w, version(), delta=True)
        held.append(client.pushed.nbytes)
        assert client.server_info().weight_version == ack.weight_version
        reference.update_weights(w, version())
        assert_same(served(client), served(reference))
    history = client.pushed.costs.history
    ways = [h.way for h in history]
    for h in history:
        print(
            f"{h.way:5} {h.changed_share or 0:6.2%} changed, encode {h.encode_seconds:.3f} s, "
            f"transfer {h.transfer_seconds:.3f} s, {h.wire_bytes} B, {h.raw_tensors} raw: {h.why}"
        )
    assert ways[0] == "full" and "no record" in history[0].why
    assert ways[1] == "delta" and "no delta measured" in history[1].why
    calm, spike, after = ways[2:5], ways[5:8], ways[8:]
    assert calm == ["delta"] * 3, ways
    # The first spiked push goes by the calm shares; it counts the new ones,
    # and the pushes after go in full while every value moves, keeping
    # samples of what they pushed instead of a copy.
    assert spike[1:] == ["full", "full"], ways
    assert all("predicted" in h.why and "samples kept" in h.why for h in history[6:8])
    assert held[6:9] == [0, 0, 0] and held[5] == held[0] > 0, held
    # The first calm push after the spike still goes by the spike's shares
    # (sampled by the full pushes); the next sees the calm share and keeps
    # its copy; then deltas.
    assert after == ["full", "full", "delta", "delta"], ways
    assert "samples kept" in history[8].why and "may pay again" in history[9].why
    assert held[9] == held[0], held
    shares = [h.changed_share for h in history]
    assert max(shares[8:]) < 0.1 < min(shares[5:8]), shares
    # Deltas on the calm steps carried a small part of the model.
    wire = [h.wire_bytes / h.model_bytes for h in history if h.way == "delta"]
    assert np.median(wire) < 0.2, wire
