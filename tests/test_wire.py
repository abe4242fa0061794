"""Hand-made chunk messages are exactly protobuf's, both ways (no engine)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_client import pb, wire

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
