"""The client's choice between a delta and a full push (delta_costs.py),
without a server: from measured costs, not from a fixed share. The choice
against a real server, both ways, is tests/engine/weights/test_delta_auto.py's."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from rollout_client.weights.delta_costs import WINDOW, Costs, sampled_share, samples

GRPC = (1, False)
MB = 1 << 20
NAMES, SIZES = ["a", "b"], [50 * MB, 50 * MB]


def ack(apply=0.5, reset=0.1, decode=0.0):
    t = SimpleNamespace(apply_seconds=apply, reset_seconds=reset, decode_seconds=decode)
    return SimpleNamespace(timings=t)


def costs(full_s: float, deltas: list[tuple[float, float]], key=GRPC) -> Costs:
    """Costs after a full push of NAMES taking `full_s` (besides apply and
    reset), then deltas [(share of every tensor, encode s per MB)] whose
    decode and transfer take as long as their encode."""
    c = Costs()
    c.observe_full(key, sum(SIZES), ack(), full_s + 0.6)
    for share, per_mb in deltas:
        c.shares.update({n: share for n in NAMES})
        enc = per_mb * sum(SIZES) / MB
        c.observe_delta(key, NAMES, SIZES, (sum(SIZES), enc, 0.01), ack(decode=enc), enc + 0.6)
    return c


def missing(c: Costs, ratio: float, times: int = 6) -> None:
    """`times` deltas at 2 % changed, each taking `ratio` times the seconds
    the components predict (the transport and the server's apply aside)."""
    for _ in range(times):
        c.shares.update({n: 0.02 for n in NAMES})
        d, _ = c.predict(GRPC, NAMES, SIZES, miss=1.0)
        c.observe_delta(GRPC, NAMES, SIZES, (sum(SIZES), 0.0, 0.0), ack(), d * ratio + 0.6)


def test_the_first_pushes_are_full_then_a_delta_measures():
    c = Costs()
    assert c.choose(GRPC, False, False, NAMES, SIZES).way == "full"  # no base
    c.observe_full(GRPC, sum(SIZES), ack(), 1.0)
    first = c.choose(GRPC, False, True, NAMES, SIZES)
    assert first.way == "delta" and "no delta measured" in first.why


def test_same_host_goes_full_whatever_was_measured():
    c = costs(1.0, [(0.01, 0.001)], key=(1, True))
    same_host = c.choose((1, True), True, True, NAMES, SIZES)
    assert same_host.way == "full" and not same_host.record  # nor kept: a copy as costly


def test_a_jump_in_the_share_goes_full_and_a_drop_comes_back():
    c = costs(1.0, [(0.01, 0.001), (0.02, 0.001)])
    low = c.choose(GRPC, False, True, NAMES, SIZES)
    assert low.way == "delta" and low.predicted_delta < low.predicted_full
    c.shares.update(a=0.95, b=0.9)  # a learning-rate spike, seen by a delta or a sample
    high = c.choose(GRPC, False, True, NAMES, SIZES)
    assert high.way == "full" and high.predicted_delta > high.predicted_full
    assert "92.50% changed" in high.why
    c.shares.update(a=0.01, b=0.01)  # sampled when a full push replaced the record
    assert c.choose(GRPC, False, True, NAMES, SIZES).way == "delta"


def test_each_tensor_goes_the_cheaper_way_within_a_delta():
    c = costs(1.0, [(0.01, 0.001), (0.02, 0.001)])
    c.shares.update(a=0.01, b=0.95)
    assert c.worth_encoding(GRPC, "a", 50 * MB)
    assert not c.worth_encoding(GRPC, "b", 50 * MB)  # its encode would not pay
    assert c.worth_encoding(GRPC, "never-seen", 50 * MB)
    # Half the tensors raw, half a small delta: cheaper than the full push.
    assert c.choose(GRPC, False, True, NAMES, SIZES).way == "delta"


def test_deltas_that_took_longer_than_predicted_lose_the_next_choice():
    c = costs(1.0, [(0.01, 0.001), (0.02, 0.001)])
    assert c.choose(GRPC, False, True, NAMES, SIZES).way == "delta"
    # The same deltas, each taking 2 s end to end (besides apply and reset):
    # the model's components miss it; what the last pushes showed wins.
    for _ in range(3):
        c.observe_delta(GRPC, NAMES, SIZES, (sum(SIZES), 0.1, 0.01), ack(decode=0.1), 2.6)
    late = c.choose(GRPC, False, True, NAMES, SIZES)
    assert late.way == "full", late


def test_each_transport_keeps_its_own_measurements():
    c = costs(1.0, [(0.01, 0.001)])
    four = c.choose((4, False), False, True, NAMES, SIZES)
    assert four.way == "delta" and "no delta measured" in four.why


def test_a_tensor_keeps_its_encoding_only_when_sending_it_costs_less():
    c = Costs()
    # Before any transport is measured: the old rule (at most half the raw bytes).
    assert c.keep_encoded(GRPC, 40, 100, 0.2) and not c.keep_encoded(GRPC, 60, 100, 0.3)
    # 100 MB per second, and a decode of 0.25 s per 100 MB.
    c.observe_full(GRPC, 100 * MB, ack(), 1.6)
    c.observe_delta(GRPC, ["x"], [100 * MB], (100 * MB, 0.1, 0.0), ack(decode=0.25), 1.0)
    assert c.keep_encoded(GRPC, 60 * MB, 100 * MB, 0.3)  # 0.6 + 0.25 < 1
    assert not c.keep_encoded(GRPC, 80 * MB, 100 * MB, 0.4)  # 0.8 + 0.25 > 1


@pytest.mark.parametrize("n", [1000, 10 * MB])
@pytest.mark.parametrize("share", [0.0, 0.05, 0.5, 1.0])
def test_the_sampled_share_is_close_to_the_counted_one(n, share):
    rng = np.random.default_rng(7)
    old = rng.integers(0, 256, n, dtype=np.uint8)
    new = old.copy()
    flip = rng.random(n) < share
    new[flip] ^= rng.integers(1, 256, int(flip.sum()), dtype=np.uint8)
    counted = float(np.count_nonzero(old != new)) / n
    assert abs(sampled_share(old, new) - counted) < 0.02


def test_while_deltas_lose_by_more_than_a_copy_a_full_push_keeps_samples():
    c = costs(1.0, [(0.01, 0.001), (0.02, 0.001)])
    c.observe_copy(sum(SIZES), 0.02)  # keeping a copy: 0.02 s
    c.shares.update(a=0.95, b=0.9)  # a spike: the delta loses by far more
    spike = c.choose(GRPC, False, True, NAMES, SIZES)
    assert spike.way == "full" and spike.keep == "samples" and not spike.record
    assert "samples kept, not a copy" in spike.why
    # With samples only, the server's base is no longer the client's: while
    # the samples show the spike, full pushes keep samples.
    again = c.choose(GRPC, False, False, NAMES, SIZES, sampled=True)
    assert (again.way, again.keep) == ("full", "samples")
    # Once they show a small share, a full push keeps its copy; then a delta.
    c.shares.update(a=0.01, b=0.01)
    back = c.choose(GRPC, False, False, NAMES, SIZES, sampled=True)
    assert (back.way, back.keep) == ("full", "copy") and "may pay again" in back.why
    assert c.choose(GRPC, False, True, NAMES, SIZES).way == "delta"


def test_a_delta_that_loses_by_less_than_a_copy_costs_keeps_the_copy():
    c = costs(1.0, [(0.01, 0.001), (0.02, 0.001)])
    missing(c, 1.5)  # deltas slower than predicted: an encoded tensor costs more
    # A close call: tensor a's share where its encoding saves less than the
    # CRC-32C a delta adds, so that the delta loses, but only just.
    for share in np.linspace(0.0, 1.0, 2001):
        c.shares.update(a=float(share), b=0.95)
        d, f = c.predict(GRPC, NAMES, SIZES)
        if d > f and c.encodes_any(GRPC, NAMES, SIZES):
            break
    else:
        raise AssertionError("no close call")
    c.observe_copy(sum(SIZES), 2 * (d - f))  # the copy costs more than the delta lost by
    close = c.choose(GRPC, False, True, NAMES, SIZES)
    assert (close.way, close.keep) == ("full", "copy")
    c.copy.clear()
    c.observe_copy(sum(SIZES), (d - f) / 2)  # less
    assert c.choose(GRPC, False, True, NAMES, SIZES).keep == "samples"


def test_the_full_push_before_a_measuring_delta_keeps_its_copy():
    c = costs(1.0, [(0.01, 0.001), (0.02, 0.001)])
    c.observe_copy(sum(SIZES), 0.02)
    c.shares.update(a=0.95, b=0.9)
    for _ in range(WINDOW - 1):
        c.observe_full(GRPC, sum(SIZES), ack(), 1.6)
    before = c.choose(GRPC, False, False, NAMES, SIZES, sampled=True)
    assert (before.way, before.keep) == ("full", "copy")  # the next one needs a base
    c.observe_full(GRPC, sum(SIZES), ack(), 1.6)
    assert "measuring again" in c.choose(GRPC, False, True, NAMES, SIZES).why


def test_samples_measure_the_share_of_a_large_tensor_as_the_whole_does():
    rng = np.random.default_rng(8)
    old = rng.integers(0, 256, 10 * MB, dtype=np.uint8)
    new = old.copy()
    flip = rng.random(old.size) < 0.1
    new[flip] ^= 1
    kept = samples(old)
    assert kept.size == old.size // 40 and not np.shares_memory(kept, old)
    assert sampled_share(kept, samples(new)) == sampled_share(old, new)


def test_a_full_push_that_keeps_samples_reads_only_the_sampled_blocks():
    # A source read from a checkpoint file pays for every byte
    # read: keeping 64 blocks of a tensor must not read it whole.
    from rollout.v1 import rollout_pb2 as pb
    from rollout_client.weights.delta_push import PushedWeights
    from rollout_codecs.sources import SourceTensor

    rng = np.random.default_rng(9)
    old = rng.integers(0, 256, 10 * MB, dtype=np.uint8)
    new = old.copy()
    new[rng.random(old.size) < 0.2] ^= 1
    read = [0]

    def source(a: np.ndarray) -> SourceTensor:
        def reader(offset: int, n: int) -> memoryview:
            read[0] += n
            return memoryview(a)[offset : offset + n]

        return SourceTensor("w", pb.D_TYPE_UINT8, [a.size], a.size, reader, lambda o, b: None)

    pushed = PushedWeights()
    pushed.record_samples([source(old)])
    pushed.record_samples([source(new)])
    assert read[0] == 2 * samples(old).size == 2 * old.size // 40
    assert pushed.costs.shares["w"] == sampled_share(old, new)
    assert abs(pushed.costs.shares["w"] - 0.2) < 0.02


def test_deltas_faster_than_predicted_never_make_a_tensor_encoded_past_half_changed():
    # What the last deltas missed scales what an encoded tensor costs, but
    # it cannot make sending 2 bytes per changed byte cheaper than sending
    # the tensor raw: at 55 % changed every tensor goes raw, so the delta is
    # the full push and a CRC-32C per tensor, never the cheaper way.
    c = costs(1.0, [(0.01, 0.001), (0.02, 0.001)])
    missing(c, 1 / 3)
    assert c.transport(GRPC).miss() < 0.7  # 1.1x raw on the wire, times this: less
    c.shares.update(a=0.55, b=0.55)  # the spike
    assert not c.worth_encoding(GRPC, "a", 50 * MB)
    assert not c.encodes_any(GRPC, NAMES, SIZES)
    d, f = c.predict(GRPC, NAMES, SIZES)
    assert d >= f
    spike = c.choose(GRPC, False, True, NAMES, SIZES)
    assert spike.way == "full" and spike.keep == "samples", spike
