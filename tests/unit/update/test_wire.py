"""Hand-made chunk messages are exactly protobuf's, both ways (no engine)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_client import pb
from rollout_codecs import wire

indices = st.integers(0, 2**32 - 1)
offsets = st.integers(0, 2**64 - 1)
datas = st.binary(max_size=300)


@given(indices, offsets, datas)
def test_update_weights_chunk_round_trips_through_protobuf(i, off, data):
    raw = wire.update_weights_chunk(i, off, data)
    msg = pb.UpdateWeightsRequest.FromString(raw)
    assert (msg.chunk.tensor_index, msg.chunk.offset, msg.chunk.data) == (i, off, data)
    expected = pb.UpdateWeightsRequest(
        chunk=pb.TensorChunk(tensor_index=i, offset=off, data=data)
    ).SerializeToString()
    parsed = wire.parse_update_weights_chunk(expected)
    assert (parsed.tensor_index, parsed.offset, bytes(parsed.data)) == (i, off, data)


@given(st.text(max_size=40), indices, offsets, datas)
def test_upload_chunk_round_trips_through_protobuf(uid, i, off, data):
    raw = wire.upload_chunk(uid, i, off, data)
    msg = pb.UploadChunksRequest.FromString(raw)
    assert (msg.update_id, msg.chunk.tensor_index, msg.chunk.offset) == (uid, i, off)
    assert msg.chunk.data == data
    parsed = wire.parse_upload_chunk(raw)
    assert (parsed.update_id, parsed.tensor_index, parsed.offset, bytes(parsed.data)) == (
        uid,
        i,
        off,
        data,
    )


@pytest.mark.parametrize(
    "msg",
    [
        pb.UpdateWeightsRequest(begin=pb.UpdateWeightsBegin(weight_version="v")),
        pb.UpdateWeightsRequest(commit=pb.UpdateWeightsCommit()),
        pb.UpdateWeightsRequest(),
    ],
)
def test_other_messages_are_left_to_protobuf(msg):
    with pytest.raises(wire.NotAChunk):
        wire.parse_update_weights_chunk(msg.SerializeToString())


@given(st.binary(max_size=64))
def test_what_the_parser_accepts_protobuf_reads_the_same(raw):
    for parse, cls in (
        (wire.parse_upload_chunk, pb.UploadChunksRequest),
        (wire.parse_update_weights_chunk, pb.UpdateWeightsRequest),
    ):
        try:
            got = parse(raw)
        except wire.NotAChunk:
            continue
        msg = cls.FromString(raw)
        assert (got.tensor_index, got.offset, bytes(got.data)) == (
            msg.chunk.tensor_index,
            msg.chunk.offset,
            msg.chunk.data,
        )


# ------------------------------------------ chunks grouped into messages


def _update(sizes: list[int], chunk_bytes: int, batch: bool):
    from rollout_client.weights import push
    from rollout_codecs.sources import SourceTensor

    tensors = []
    for i, n in enumerate(sizes):
        data = bytes((i + j) % 251 for j in range(n))
        tensors.append(
            SourceTensor(
                name=f"t{i}",
                dtype=pb.D_TYPE_UINT8,
                shape=[n],
                nbytes=n,
                read=lambda off, k, d=data: memoryview(d)[off : off + k],
                read_into=lambda off, buf, d=data: buf.__setitem__(
                    slice(None), d[off : off + len(buf)]
                ),
            )
        )
    begin = pb.UpdateWeightsBegin(weight_version="v1")
    return push.Update(tensors=tensors, begin=begin, chunk_bytes=chunk_bytes, batch_chunks=batch)


def _sent(u) -> tuple[list[pb.UpdateWeightsRequest], dict[int, bytes]]:
    """The stream's messages, and each tensor's bytes as they arrive."""
    from rollout_client.weights import push

    msgs = [pb.UpdateWeightsRequest.FromString(m) for m in push.update_weights_requests(u)]
    got: dict[int, bytearray] = {}
    for m in msgs:
        kind = m.WhichOneof("kind")
        chunks = [m.chunk] if kind == "chunk" else list(m.chunks.chunks) if kind == "chunks" else []
        for c in chunks:
            b = got.setdefault(c.tensor_index, bytearray())
            assert c.offset == len(b), "in order, no gap"
            b += c.data
    return msgs, {i: bytes(b) for i, b in got.items()}


@pytest.mark.parametrize("batch", [True, False])
def test_small_chunks_travel_together_only_where_the_server_takes_batches(batch):
    sizes = [10, 300, 5000, 3, 1, 2500, 40, 0, 7]  # chunks of 1000: small under 250
    u = _update(sizes, 1000, batch)
    msgs, got = _sent(u)
    kinds = [m.WhichOneof("kind") for m in msgs]
    assert kinds[0] == "begin" and kinds[-1] == "commit"
    for i, n in enumerate(sizes):
        assert got.get(i, b"") == bytes(u.tensors[i].read(0, n)), f"tensor {i}"
    batches = [m.chunks.chunks for m in msgs if m.WhichOneof("kind") == "chunks"]
    if not batch:
        assert not batches
        assert kinds.count("chunk") == sum(-(-n // 1000) for n in sizes)
        return
    # Runs of chunks under 250 bytes between larger ones (a run of one goes alone).
    assert [[c.tensor_index for c in b] for b in batches] == [[3, 4], [6, 8]]
    assert kinds.count("chunk") + sum(len(b) for b in batches) == sum(-(-n // 1000) for n in sizes)
    assert len(msgs) < 2 + sum(-(-n // 1000) for n in sizes), "fewer messages than chunks"
    whole = len(pb.UpdateWeightsRequest(chunk=pb.TensorChunk(data=bytes(1000))).SerializeToString())
    assert all(len(m.SerializeToString()) <= whole for m in msgs if m.HasField("chunks"))


def test_a_batch_holds_at_most_1024_chunks():
    from rollout_client.weights import push

    u = _update([1] * 2500, 1 << 20, True)
    msgs, got = _sent(u)
    sizes = [len(m.chunks.chunks) for m in msgs if m.WhichOneof("kind") == "chunks"]
    assert sizes == [push.MAX_BATCH_CHUNKS, push.MAX_BATCH_CHUNKS, 2500 - 2 * 1024]
    assert len(got) == 2500
    # Many small chunks: a batch holds half of the chunk size in data, at most.
    u = _update([90] * 50, 1000, True)
    msgs, got = _sent(u)
    sizes = [len(m.chunks.chunks) for m in msgs if m.WhichOneof("kind") == "chunks"]
    assert sizes == [5] * 10 and len(got) == 50
