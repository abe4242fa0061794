"""The delta encodings (rollout_codecs/delta.py, the proto's TensorEncoding)
and the plan's checks of a delta's begin, without an engine: encoding
then decoding gives the new bytes back, bit for bit, compiled or not; every
malformed payload the proto allows is refused with what is wrong, before a
word is written."""

from __future__ import annotations

import os

import crc32c
import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_client import pb
from rollout_codecs import delta
from rollout_service.status.errors import FailedPrecondition, InvalidArgument
from rollout_service.update.plan import Placement, Target
from tests.support.regions import FakeRegion
from tests.support.update_stream import UpdateStream


def payload(values, gaps, unit="<u2") -> bytes:
    v = np.asarray(values, dtype=unit).tobytes()
    g = np.asarray(gaps, dtype=unit).tobytes()
    return len(values).to_bytes(4, "little") + v + g


# SPARSE_XOR16 names 16-bit words, SPARSE_XOR8 bytes: every codec test runs on both.
UNITS = {np.dtype(np.uint16): delta.SPARSE, np.dtype(np.uint8): delta.SPARSE8}


@st.composite
def base_and_new(draw):
    unit = draw(st.sampled_from(list(UNITS)))
    n = draw(st.integers(1, 300_000))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    top = 1 << (8 * unit.itemsize)
    base = rng.integers(0, top, n, dtype=unit)
    new = base.copy()
    share = draw(st.sampled_from([0.0, 1e-5, 0.003, 0.01, 0.3, 1.0]))
    changed = rng.random(n) < share
    new[changed] ^= rng.integers(1, top, int(changed.sum()), dtype=unit)
    if draw(st.booleans()):  # the last element, and one far from the others
        new[-1] ^= 1
        new[n // 2] ^= top >> 1
    return base, new


@settings(max_examples=60, deadline=None)
@given(base_and_new())
def test_encode_then_apply_gives_the_new_words_and_applying_again_undoes(pair):
    base, new = pair
    encoding, size = UNITS[base.dtype], base.itemsize
    encoded = {c: delta.encode_sparse(base, new, compiled=c).tobytes() for c in (True, False)}
    assert encoded[True] == encoded[False], "compiled and numpy encoders differ"
    data = encoded[True]
    k = delta.check_sparse(data, base.size, encoding)
    assert len(data) == 4 + 2 * size * k <= delta.sparse_bound(base.nbytes, encoding)
    gaps = np.frombuffer(data, base.dtype, k, 4 + size * k)
    assert k == 0 or (gaps.min() >= 1 and int(gaps.sum()) - 1 < base.size)
    for compiled in (True, False):
        words = base.copy()
        delta.apply_sparse(words, data, compiled=compiled)
        assert np.array_equal(words, new)
        delta.apply_sparse(words, data, compiled=compiled)
        assert np.array_equal(words, base)


@settings(max_examples=15, deadline=None)
@given(base_and_new())
def test_the_fused_apply_gives_the_same_bytes_and_their_crc(pair):
    base, new = pair
    data = delta.encode_sparse(base, new, compiled=False)
    crc = crc32c.crc32c(new.tobytes())
    target = bytearray(base.tobytes())
    assert delta.apply_sparse_crc(target, data.tobytes(), UNITS[base.dtype]) == crc
    assert bytes(target) == new.tobytes()


@pytest.mark.parametrize("compiled", [True, False])
def test_distances_over_65535_words_are_bridged_by_zero_entries(compiled):
    base = np.zeros(200_000, dtype=np.uint16)
    new = base.copy()
    new[[0, 140_000]] = (7, 9)
    data = delta.encode_sparse(base, new, compiled=compiled).tobytes()
    # entry at 0 (g=1), then bridges of 65535 with x=0, then the change
    assert data == payload([7, 0, 0, 9], [1, 65535, 65535, 140_000 - 2 * 65535])


@pytest.mark.parametrize("compiled", [True, False])
def test_sparse_xor8_bridges_distances_over_255_bytes_and_takes_two_bytes_an_entry(compiled):
    base = np.zeros(1000, dtype=np.uint8)
    new = base.copy()
    new[[3, 258, 259, 800]] = (1, 2, 3, 4)
    data = delta.encode_sparse(base, new, compiled=compiled).tobytes()
    # 3 (g=4), 258 (g=255: no bridge), 259 (g=1), then 800: bridges at 514 and 769, then g=31
    assert data == payload([1, 2, 3, 0, 0, 4], [4, 255, 1, 255, 255, 31], unit="u1")
    assert len(data) == 4 + 2 * 6
    # A bf16 value whose change flips only low bits: one entry (the low byte comes first).
    words = np.array([0x3F80, 0x3F80], dtype="<u2")
    moved = words.copy()
    moved[1] += 1
    assert delta.encode_sparse(words.view(np.uint8), moved.view(np.uint8)).tobytes() == payload(
        [1], [3], unit="u1"
    )


def test_the_zstd_frame_round_trips_and_states_its_size():
    base = np.zeros(50_000, dtype=np.uint16)
    new = base.copy()
    new[::97] = 3
    data = delta.encode_sparse(base, new).tobytes()
    frame = delta.zstd_compress(data)
    assert zstandard.frame_content_size(frame) == len(data)
    assert delta.zstd_decompress(frame, 2 * base.size) == data


@pytest.mark.parametrize(
    ("data", "words", "why"),
    [
        (b"\x01\x00", 10, "shorter than the 4-byte entry count"),
        (payload([1], [1])[:-1], 10, "its entry count 1 makes it 8"),
        (payload([1, 2], [1, 0]), 10, "gap 1 is 0"),
        (payload([1, 2], [5, 6]), 10, "names word 10, but the tensor has 10"),
        (payload([], []) + b"\0\0\0\0", 10, "its entry count 0 makes it 4"),
    ],
)
def test_malformed_sparse_bytes_are_refused_with_the_reason(data, words, why):
    with pytest.raises(delta.DeltaError, match=why):
        delta.check_sparse(data, words)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (payload([1], [1], "u1")[:-1], "5 bytes, but its entry count 1 makes it 6"),
        (payload([1], [1]), "8 bytes, but its entry count 1 makes it 6"),  # XOR16's entry
        (payload([1, 2], [1, 0], "u1"), "gap 1 is 0"),
        (payload([1, 2], [5, 5], "u1"), "names byte 9, but the tensor has 9"),
    ],
)
def test_malformed_sparse_xor8_bytes_are_refused_with_the_reason(data, why):
    with pytest.raises(delta.DeltaError, match=why):
        delta.check_sparse(data, 9, delta.SPARSE8)


def test_a_zstd_frame_that_hides_or_inflates_its_size_is_refused_before_decompressing():
    body = payload([1], [1])
    hidden = zstandard.ZstdCompressor(write_content_size=False).compress(body)
    with pytest.raises(delta.DeltaError, match="does not state its content size"):
        delta.zstd_decompress(hidden, 20)
    # A small frame of a large content: a bomb for a tensor of 20 bytes.
    bomb = zstandard.ZstdCompressor().compress(bytes(10 << 20))
    with pytest.raises(
        delta.DeltaError, match="holds 10485760 bytes, over the 48 this tensor allows"
    ):
        delta.zstd_decompress(bomb, 20)
    with pytest.raises(delta.DeltaError, match="not a zstd frame"):
        delta.zstd_decompress(b"not zstd at all", 20)


# ------------------------------------------------------------ the plan and the receiver

MANIFEST = {
    "w": pb.TensorSpec(name="w", dtype=pb.D_TYPE_BFLOAT16, shape=[8, 4]),
    "b": pb.TensorSpec(name="b", dtype=pb.D_TYPE_UINT8, shape=[3]),
}


def assembler(delta_base="v0"):
    slots = {"w": 0, "b": 64}
    placement = Placement(FakeRegion(), slots=slots, incoming=FakeRegion(), delta_base=delta_base)
    return UpdateStream(Target(MANIFEST, "v0"), placement)


def begin(*specs, base="v0"):
    return pb.UpdateWeightsBegin(weight_version="v1", base_version=base, tensors=list(specs))


def sparse_spec(**kw):
    fields = dict(
        name="w",
        dtype=pb.D_TYPE_BFLOAT16,
        shape=[8, 4],
        encoding=delta.SPARSE,
        encoded_bytes=8,
        crc32c=1,
    )
    return pb.TensorSpec(**{**fields, **kw})


def test_a_delta_against_another_base_is_refused_with_its_reason():
    with pytest.raises(FailedPrecondition) as e:
        assembler().begin(begin(sparse_spec(), base="v-old"))
    assert e.value.reason == pb.ERROR_REASON_DELTA_BASE_MISMATCH
    assert "'v-old' is not this server's delta base (its base is 'v0'" in str(e.value)
    with pytest.raises(FailedPrecondition, match="this server keeps no delta base"):
        assembler(delta_base="").begin(begin(sparse_spec()))


@pytest.mark.parametrize(
    ("spec", "base", "field", "why"),
    [
        (sparse_spec(), "", "begin.tensors[0].encoding", "needs begin.base_version"),
        (sparse_spec(crc32c=None), "v0", "begin.tensors[0].crc32c", "declares the CRC-32C"),
        (sparse_spec(encoded_bytes=0), "v0", "begin.tensors[0].encoded_bytes", "must be 1 to"),
        (sparse_spec(encoded_bytes=10**9), "v0", "begin.tensors[0].encoded_bytes", "1 to 136"),
        (
            pb.TensorSpec(
                name="b", dtype=pb.D_TYPE_UINT8, shape=[3], encoding=delta.SPARSE, crc32c=0
            ),
            "v0",
            "begin.tensors[0].encoding",
            "3 bytes, not whole 16-bit words",
        ),
        (
            sparse_spec(encoding=delta.SPARSE8, encoded_bytes=10**9),
            "v0",
            "begin.tensors[0].encoded_bytes",
            "1 to 134 for TENSOR_ENCODING_SPARSE_XOR8 of 64 bytes",
        ),
        (
            pb.TensorSpec(name="b", dtype=pb.D_TYPE_UINT8, shape=[3], encoded_bytes=3, crc32c=0),
            "v0",
            "begin.tensors[0].encoded_bytes",
            "set only for an encoded tensor",
        ),
    ],
)
def test_a_bad_encoding_is_refused_naming_the_field(spec, base, field, why):
    with pytest.raises(InvalidArgument) as e:
        assembler().begin(begin(spec, base=base))
    assert e.value.field == field and why in str(e.value)


def test_the_incoming_region_grows_with_a_quarter_to_spare():
    """So that the next step's delta, a little larger, does not pay for
    growing it (allocating and faulting in its pages) again."""
    plan = assembler().begin(begin(sparse_spec(encoded_bytes=64)))
    assert plan.region.size == 64 + 16
    full = assembler()
    plan = full.begin(
        begin(pb.TensorSpec(name="w", dtype=pb.D_TYPE_BFLOAT16, shape=[8, 4]), base="")
    )
    assert plan.region is full.staging and plan.region.size == 64, "slots: no room added"


def test_a_delta_that_does_not_fit_in_dev_shm_is_resource_exhausted(monkeypatch):
    from rollout_service.handoff.region import StagingSpaceError
    from rollout_service.status.errors import ResourceExhausted

    asm = assembler()

    def full(*args, **kwargs):
        raise StagingSpaceError(1 << 30, 1 << 20)

    monkeypatch.setattr(asm.placement.incoming, "ensure", full)
    with pytest.raises(ResourceExhausted) as e:
        asm.begin(begin(sparse_spec(encoded_bytes=8)))
    assert "begin.tensors: the update's 8 bytes do not fit" in str(e.value)
    assert "--shm-size" in str(e.value)


def test_a_delta_arrives_packed_in_the_incoming_region_never_in_the_slots():
    asm = assembler()
    plan = asm.begin(begin(sparse_spec(encoded_bytes=8)))
    assert plan.region is not asm.staging and plan.tensor_offsets == [0]
    asm.add_chunk(0, 0, payload([5], [3]))
    staged = asm.finish(require_commit=False)
    assert staged.base_version == "v0" and staged.delta is not None
    (t,) = staged.delta.tensors
    assert (t.wire_offset, t.wire_nbytes, t.slot_offset, t.nbytes) == (0, 8, 0, 64)
    assert bytes(asm.staging.ensure(0)) == bytes(len(asm.staging.buf)), "slots untouched"


# ------------------------------------------------------------ the client's record


def test_the_clients_record_is_bounded_and_what_does_not_fit_goes_raw():
    from rollout_client.weights import push
    from rollout_client.weights.delta_push import PushedWeights

    rng = np.random.default_rng(3)
    old = {n: rng.integers(0, 1 << 16, 4096, dtype=np.uint16) for n in ("a", "b", "c")}
    manifest = [pb.TensorSpec(name=n, dtype=pb.D_TYPE_INT16, shape=[4096]) for n in old]
    pushed = PushedWeights(max_bytes=2 * 8192)  # room for two of the three
    u = push.prepare({n: w.view(np.int16) for n, w in old.items()}, "v1", manifest)
    pushed.record_full(u.tensors, pb.UpdateWeightsResponse(weight_version="v1"))
    assert pushed.version == "v1" and pushed.nbytes == 2 * 8192
    new = {n: w.copy() for n, w in old.items()}
    for w in new.values():
        w[::100] ^= 1  # about 1% of the words
    new["b"] = old["b"].copy()  # unchanged: not sent
    d = pushed.delta(push.prepare({n: w.view(np.int16) for n, w in new.items()}, "v2", manifest))
    sent = {s.name: s for s in d.update.begin.tensors}
    assert d.update.begin.base_version == "v1" and set(sent) == {"a", "c"}
    assert sent["a"].encoding in delta.ENCODED and delta.is_raw(sent["c"].encoding)
    assert all(s.HasField("crc32c") for s in sent.values())
    assert d.wire_bytes < 8192 + 0.1 * 8192
    # Nothing is recorded until the delta is acknowledged; then the record is the new bytes.
    assert pushed.version == "v1"
    pushed.record_delta(d, "v2")
    again = pushed.delta(
        push.prepare({n: w.view(np.int16) for n, w in new.items()}, "v3", manifest)
    )
    assert [s.name for s in again.update.begin.tensors] == ["c"], "a matches its record now"


def test_the_record_takes_a_delta_while_it_is_sent_and_gives_it_back_if_it_is_not_acknowledged():
    from rollout_client.weights import push
    from rollout_client.weights.delta_push import PushedWeights

    rng = np.random.default_rng(4)
    old = {n: rng.integers(0, 1 << 16, 4096, dtype=np.uint16) for n in ("a", "b")}
    manifest = [pb.TensorSpec(name=n, dtype=pb.D_TYPE_INT16, shape=[4096]) for n in old]
    pushed = PushedWeights()
    u = push.prepare({n: w.view(np.int16) for n, w in old.items()}, "v1", manifest)
    pushed.record_full(u.tensors, pb.UpdateWeightsResponse(weight_version="v1"))
    new = {n: w.copy() for n, w in old.items()}
    for w in new.values():
        w[::50] ^= 3

    def record() -> dict[str, bytes]:
        return {n: bytes(b) for n, b in pushed._bytes.items()}

    def delta_of_new():
        return pushed.delta(
            push.prepare({n: w.view(np.int16) for n, w in new.items()}, "v2", manifest)
        )

    d = delta_of_new()
    with pytest.raises(RuntimeError), pushed.sending(d):
        raise RuntimeError("the stream broke")
    assert record() == {n: w.tobytes() for n, w in old.items()} and not d.applied
    d = delta_of_new()
    with pushed.sending(d):
        pass
    assert record() == {n: w.tobytes() for n, w in new.items()} and d.applied
    pushed.withdraw(d)  # sent, and nobody acknowledged it (a fleet's commits all failed)
    assert record() == {n: w.tobytes() for n, w in old.items()} and not d.applied
    d = delta_of_new()
    with pushed.sending(d):
        pass
    pushed.record_delta(d, "v2")  # not applied twice
    assert record() == {n: w.tobytes() for n, w in new.items()} and pushed.version == "v2"


# ------------------------------------------------------------ the server's base


@pytest.fixture(params=[1, 2], ids=["one-decode-thread", "two-decode-threads"])
def base(request):
    from rollout_service.handoff.region import StagingRegion
    from rollout_service.update.delta_base import DeltaBase

    manifest = {n: pb.TensorSpec(name=n, dtype=pb.D_TYPE_BFLOAT16, shape=[4096]) for n in "ab"}
    staging, incoming = StagingRegion(), StagingRegion()
    staging.ensure(2 * 8192)
    b = DeltaBase(manifest, staging, incoming, decode_threads=request.param)
    rng = np.random.default_rng(5)
    staging.ensure(0)[: 2 * 8192] = rng.integers(0, 1 << 16, 8192, dtype=np.uint16).tobytes()
    yield b
    b.close()
    staging.close()
    incoming.close()


def plan_of(b, payloads: dict[str, bytes], crcs: dict[str, int], encoding=delta.SPARSE):
    from rollout_service.update.delta_base import DeltaPlan, DeltaTensor

    wire = b.incoming.ensure(sum(len(p) for p in payloads.values()))
    tensors, at = [], 0
    for i, (name, data) in enumerate(payloads.items()):
        wire[at : at + len(data)] = data
        tensors.append(
            DeltaTensor(i, name, encoding, at, len(data), b.offsets[name], 8192, crcs[name])
        )
        at += len(data)
    return DeltaPlan(base_version="v0", tensors=tensors)


def decode_or_undo(b, plan):
    """What the server does with a delta it loads in one group: check its
    entries, decode it into the base, undo it if a tensor is refused."""
    b.check(plan)
    try:
        b.decode(plan, plan.tensors)
    except InvalidArgument:
        b.undo(plan)
        raise


@pytest.mark.parametrize("encoding", [delta.SPARSE, delta.SPARSE8])
def test_a_refused_tensor_undoes_every_tensor_before_it(base, encoding):
    unit = delta.element(encoding)
    before = bytes(base.staging.ensure(0)[: 2 * 8192])
    slots = {n: np.frombuffer(before, unit, 8192 // unit.itemsize, base.offsets[n]) for n in "ab"}
    new_a = slots["a"].copy()
    new_a[::7] ^= 1
    good = delta.encode_sparse(slots["a"], new_a).tobytes()
    crc_a = crc32c.crc32c(new_a.tobytes())
    for bad, field, why in [
        (payload([1, 2], [1, 0], unit), "begin.tensors[1].encoding", "gap 1 is 0"),
        (payload([1], [1], unit), "begin.tensors[1].crc32c", "reconstructs bytes with CRC-32C"),
    ]:
        plan = plan_of(base, {"a": good, "b": bad}, {"a": crc_a, "b": 12345}, encoding)
        with pytest.raises(InvalidArgument) as e:
            decode_or_undo(base, plan)
        assert e.value.field == field and why in str(e.value)
        assert bytes(base.staging.ensure(0)[: 2 * 8192]) == before, "the base is untouched"
    plan = plan_of(base, {"a": good}, {"a": crc_a}, encoding)
    decode_or_undo(base, plan)
    assert bytes(base.staging.ensure(0)[:8192]) == new_a.tobytes()
    base.undo(plan)
    assert bytes(base.staging.ensure(0)[: 2 * 8192]) == before


def test_entries_that_do_not_decode_are_refused_before_any_tensor_is_written(base):
    """check() is what the server runs before the engine is touched: a bad
    entry in the last tensor refuses the delta with the first one unwritten."""
    before = bytes(base.staging.ensure(0)[: 2 * 8192])
    good = payload([1, 2], [3, 4])
    bad = payload([1, 2], [1, 0])  # gap 0
    plan = plan_of(base, {"a": good, "b": bad}, {"a": 0, "b": 0})
    with pytest.raises(InvalidArgument) as e:
        base.check(plan)
    assert e.value.field == "begin.tensors[1].encoding"
    assert bytes(base.staging.ensure(0)[: 2 * 8192]) == before and not plan._applied


def test_of_several_refused_tensors_the_first_is_named_and_none_is_applied(base):
    before = bytes(base.staging.ensure(0)[: 2 * 8192])
    bad = payload([1], [1])  # decodes, to another CRC-32C than the declared 0
    plan = plan_of(base, {"a": bad, "b": bad}, {"a": 0, "b": 0})
    for _ in range(5):  # whichever thread ends first
        with pytest.raises(InvalidArgument) as e:
            decode_or_undo(base, plan)
        assert e.value.field == "begin.tensors[0].crc32c"
        assert bytes(base.staging.ensure(0)[: 2 * 8192]) == before


@pytest.mark.parametrize("borrow", [True, False], ids=["engine-idle", "engine-loading"])
def test_decode_threads_borrow_every_cpu_and_give_them_back(base, monkeypatch, borrow):
    """With more than one decode thread, each tensor of the first group (the
    engine idle) is decoded on every CPU the process was given (the worker's
    too, on a CPU host), and the thread is back on the server's own CPUs
    after it; the groups decoded while the engine loads stay on the server's."""
    import threading

    cpus = os.sched_getaffinity(0)
    own = {min(cpus)}
    base.decode_cpus = cpus
    seen: list[tuple[int, set[int]]] = []
    apply = delta.apply_sparse_crc

    def spying(*args):
        seen.append((threading.get_native_id(), os.sched_getaffinity(0)))
        return apply(*args)

    monkeypatch.setattr(delta, "apply_sparse_crc", spying)
    slots = {n: np.frombuffer(base.staging.ensure(0), "<u2", 4096, base.offsets[n]) for n in "ab"}
    payloads, crcs = {}, {}
    for n, words in slots.items():
        new = words.copy()
        new[::5] ^= 3
        payloads[n] = delta.encode_sparse(words, new).tobytes()
        crcs[n] = crc32c.crc32c(new.tobytes())
    plan = plan_of(base, payloads, crcs)

    def on_one_cpu():  # as placement.py leaves the server's threads
        os.sched_setaffinity(0, own)
        base.check(plan)
        base.decode(plan, plan.tensors, borrow)

    t = threading.Thread(target=on_one_cpu)
    t.start()
    t.join()
    assert len(seen) == 2
    if base.decode_threads == 1 or not borrow:
        assert all(got == own for _, got in seen), "the decode stays on the server's CPUs"
        return
    assert all(got == cpus for _, got in seen), seen
    for native_id, _ in seen:
        assert os.sched_getaffinity(native_id) == own, "back on the server's CPUs"


def test_a_zstd_frame_claiming_more_than_its_tensor_allows_is_refused_untouched(base):
    before = bytes(base.staging.ensure(0)[: 2 * 8192])
    bomb = zstandard.ZstdCompressor().compress(bytes(1 << 20))
    plan = plan_of(base, {"a": bomb}, {"a": 0}, encoding=delta.SPARSE_ZSTD)
    base.check(plan)  # a frame is only decompressed in decode
    with pytest.raises(InvalidArgument, match="over the 16392 this tensor allows"):
        base.decode(plan, plan.tensors)
    assert bytes(base.staging.ensure(0)[: 2 * 8192]) == before
