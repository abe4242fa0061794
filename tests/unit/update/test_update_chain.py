"""An update's plan and its receiver alone (plan.py, upload.py): order,
coverage, limits (no engine)."""

from __future__ import annotations

import crc32c
import pytest

from rollout.v1 import rollout_pb2 as pb
from rollout_service.status.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from rollout_service.update import upload as upload_module
from rollout_service.update.delta_base import DeltaBase, slot_layout
from rollout_service.update.plan import Placement, Target
from rollout_service.update.upload import Coverage, Upload
from tests.support.regions import FakeRegion
from tests.support.update_stream import UpdateStream

MANIFEST = {
    "a": pb.TensorSpec(name="a", dtype=pb.D_TYPE_BFLOAT16, shape=[4, 8]),  # 64 bytes
    "b": pb.TensorSpec(name="b", dtype=pb.D_TYPE_BFLOAT16, shape=[3]),  # 6 bytes
}


def assembler(max_bytes=1 << 20, current="v0"):
    return UpdateStream(Target(MANIFEST, current), Placement(FakeRegion()), max_bytes)


def begin(*specs, version="v1"):
    return pb.UpdateWeightsRequest(
        begin=pb.UpdateWeightsBegin(weight_version=version, tensors=list(specs))
    )


def chunk(i, off, data):
    return pb.UpdateWeightsRequest(chunk=pb.TensorChunk(tensor_index=i, offset=off, data=data))


COMMIT = pb.UpdateWeightsRequest(commit=pb.UpdateWeightsCommit())


def test_chunks_in_any_order_land_at_their_offsets():
    asm = assembler()
    data_a, data_b = bytes(range(64)), b"abcdef"
    for msg in [
        begin(MANIFEST["a"], MANIFEST["b"]),
        chunk(1, 3, data_b[3:]),
        chunk(0, 32, data_a[32:]),
        chunk(1, 0, data_b[:3]),
        chunk(0, 0, data_a[:32]),
        COMMIT,
    ]:
        asm.feed(msg)
    staged = asm.finish()
    buf = asm.staging.buf
    a, b = staged.tensors
    assert bytes(buf[a.offset : a.offset + 64]) == data_a
    assert bytes(buf[b.offset : b.offset + 6]) == data_b
    assert staged.bytes_received == 70 and staged.weight_version == "v1"
    assert b.offset % 64 == 0 and a.dtype == "bfloat16" and a.shape == (4, 8)


def test_checksum_is_verified():
    good = pb.TensorSpec(
        name="b", dtype=pb.D_TYPE_BFLOAT16, shape=[3], crc32c=crc32c.crc32c(b"abcdef")
    )
    asm = assembler()
    for msg in [begin(good), chunk(0, 0, b"abcdef"), COMMIT]:
        asm.feed(msg)
    asm.finish()
    asm = assembler()
    for msg in [begin(good), chunk(0, 0, b"abcdeX"), COMMIT]:
        asm.feed(msg)
    with pytest.raises(InvalidArgument, match="checksum"):
        asm.finish()


def test_size_limit():
    with pytest.raises(ResourceExhausted, match="max_update_bytes"):
        assembler(max_bytes=32).feed(begin(MANIFEST["a"]))


def test_same_version_is_a_conflict():
    with pytest.raises(FailedPrecondition, match="already"):
        assembler(current="v1").feed(begin(MANIFEST["a"]))


def test_huge_offsets_are_rejected():
    # (Unknown enum values are the contract's rules, refused where begin
    # enters: test_weight_transfers.py.)
    asm = assembler()
    asm.feed(begin(MANIFEST["b"]))
    with pytest.raises(InvalidArgument, match="past"):
        asm.feed(chunk(0, 2**64 - 1, b"x"))


@pytest.mark.parametrize(
    ("ranges", "ok"),
    [
        ([(0, 4), (4, 8)], True),
        ([(4, 8), (0, 4)], True),
        ([(0, 4), (8, 12), (4, 8)], True),
        ([(0, 4), (3, 5)], False),
        ([(4, 8), (2, 5)], False),
        ([(0, 10), (2, 3)], False),
        ([(2, 3), (0, 10)], False),
    ],
)
def test_coverage_detects_overlap(ranges, ok):
    cov = Coverage()
    results = [cov.add(a, b) == "" for a, b in ranges]
    assert all(results) == ok
    if ok:
        assert cov.starts == [min(a for a, _ in ranges)]
        assert cov.received == sum(b - a for a, b in ranges)


def batch(*chunks):
    return pb.UpdateWeightsRequest(
        chunks=pb.TensorChunkBatch(
            chunks=[pb.TensorChunk(tensor_index=i, offset=o, data=d) for i, o, d in chunks]
        )
    )


def test_a_batch_of_chunks_lands_as_its_chunks_would_one_by_one():
    data_a, data_b = bytes(range(64)), b"abcdef"
    asm = assembler()
    asm.feed(begin(MANIFEST["a"], MANIFEST["b"]))
    asm.feed(batch((1, 0, data_b), (0, 32, data_a[32:])))
    asm.feed(chunk(0, 0, data_a[:32]))
    asm.feed(COMMIT)
    a, b = asm.finish().tensors
    buf = asm.staging.buf
    assert bytes(buf[a.offset : a.offset + 64]) == data_a
    assert bytes(buf[b.offset : b.offset + 6]) == data_b


@pytest.mark.parametrize(
    ("chunks", "field", "why"),
    [
        ([(0, 0, b"xx"), (0, 1, b"y")], "chunks.chunks[1].offset", "overlap bytes already"),
        ([(1, 4, b"xyz")], "chunks.chunks[0].offset", "run past the tensor's end"),
        ([(0, 0, b"x"), (7, 0, b"x")], "chunks.chunks[1].tensor_index", "out of range"),
        ([(0, 0, b"")], "chunks.chunks[0].data", "empty chunk"),
        ([(0, i, b"x") for i in range(1025)], "chunks.chunks", "1025 chunks, at most 1024"),
    ],
)
def test_a_bad_chunk_in_a_batch_is_refused_naming_it(chunks, field, why):
    asm = assembler()
    asm.feed(begin(MANIFEST["a"], MANIFEST["b"]))
    with pytest.raises(InvalidArgument) as e:
        asm.feed(batch(*chunks))
    assert e.value.field == field and why in str(e.value)


def test_a_tensors_bytes_may_form_only_so_many_separate_ranges(monkeypatch):
    """Out-of-order chunks cost a sorted insertion each: their ranges are bounded."""
    monkeypatch.setattr(upload_module, "MAX_RANGES", 3)
    asm = assembler()
    asm.feed(begin(MANIFEST["a"]))
    asm.feed(batch((0, 40, b"x"), (0, 20, b"x"), (0, 0, b"x")))
    with pytest.raises(InvalidArgument, match="form 3 separate ranges") as e:
        asm.feed(chunk(0, 10, b"x"))
    assert e.value.field == "chunk.offset"
    asm.feed(chunk(0, 1, b"x" * 19))  # joins two ranges: one fewer
    asm.feed(chunk(0, 10 + 50, b"x"))  # a third again


def test_a_piece_of_a_fused_group_is_refused_at_begin_naming_the_rest():
    manifest = {n: pb.TensorSpec(name=n, dtype=pb.D_TYPE_BFLOAT16, shape=[2]) for n in "qkvo"}
    group = ["k", "q", "v"]

    def grouped():
        return UpdateStream(Target(manifest, "v0", groups=dict.fromkeys(group, group)))

    with pytest.raises(InvalidArgument) as e:
        grouped().feed(begin(manifest["q"], manifest["o"]))
    assert "k, v" in str(e.value) and "begin.tensors[0].name" in str(e.value)
    grouped().feed(begin(manifest["q"], manifest["k"], manifest["v"]))  # the whole group is fine
    grouped().feed(begin(manifest["o"]))  # so is a tensor outside any group


def test_0d_and_empty_tensors_stage_and_their_content_is_recorded():
    manifest = {
        "scale": pb.TensorSpec(name="scale", dtype=pb.D_TYPE_FLOAT32, shape=[]),
        "none": pb.TensorSpec(name="none", dtype=pb.D_TYPE_INT64, shape=[0, 4]),
    }
    asm = UpdateStream(Target(manifest, "v0"))
    for msg in [begin(manifest["scale"], manifest["none"]), chunk(0, 0, b"\0\0\0?"), COMMIT]:
        asm.feed(msg)
    staged = asm.finish()
    scale, none = staged.tensors
    assert (scale.shape, scale.nbytes, none.shape, none.nbytes) == ((), 4, (0, 4), 0)
    content = staged.content()
    assert content[0] == ("scale", "float32", (), crc32c.crc32c(b"\0\0\0?"))


def test_the_served_version_is_accepted_only_as_a_retry_of_its_update():
    with pytest.raises(FailedPrecondition):
        assembler(current="v1").feed(begin(MANIFEST["a"], version="v1"))
    asm = UpdateStream(Target(MANIFEST, "v1", replayable_version="v1"))
    asm.feed(begin(MANIFEST["a"], version="v1"))  # compared by content later (base_weights.py)


def _slotted() -> tuple[DeltaBase, UpdateStream]:
    """A delta base holding "v0" in every slot, and an update stream whose
    full updates write into those slots (base_weights.plan's placement),
    marking them as the transfer does (WeightUpdater.stale_slots)."""
    staging, incoming = FakeRegion(), FakeRegion()
    staging.ensure(slot_layout(MANIFEST)[1])
    base = DeltaBase(MANIFEST, staging, incoming)
    base.installed("v0", set(MANIFEST))
    placement = Placement(staging, base.offsets, incoming, delta_base="v0")
    return base, UpdateStream(Target(MANIFEST, "v0"), placement, writing=base.writing)


def test_a_slot_is_stale_from_its_first_byte_not_from_begin():
    base, asm = _slotted()
    plan = asm.begin(begin(MANIFEST["a"], MANIFEST["b"]).begin)
    assert plan.writes_slots and base.offered("v0", False) == ("v0", "")
    with pytest.raises(InvalidArgument):
        asm.add_chunk(1, 4, b"xyz")  # past b's end: refused, nothing written
    assert base.offered("v0", False) == ("v0", "")
    asm.add_chunk(1, 0, b"x")
    assert base.stale == {"b"} and base.offered("v0", False)[0] == ""
    asm.add_chunk(1, 1, b"y")
    assert base.stale == {"b"}


def test_a_same_host_update_makes_its_slots_stale_from_begin():
    base, asm = _slotted()
    plan = asm.begin(begin(MANIFEST["a"]).begin)
    assert not base.stale
    Upload(plan, plan.reserve(), same_host=True, writing=base.writing)  # the client writes unseen
    assert base.stale == {"a"}


def test_a_delta_writes_no_slot_before_its_decode():
    base, asm = _slotted()
    a = pb.TensorSpec(name="a", dtype=pb.D_TYPE_BFLOAT16, shape=[4, 8], crc32c=0)
    plan = asm.begin(pb.UpdateWeightsBegin(weight_version="v1", base_version="v0", tensors=[a]))
    asm.add_chunk(0, 0, b"x")  # into the incoming region
    assert not plan.writes_slots and not base.stale
