"""Staged updates against the real engine: begin, parallel and resumed
uploads, the same-host handoff, commit, abort. Whatever way the bytes come,
the served weights are exactly the ones sent."""

from __future__ import annotations

import os
import stat
import threading

import crc32c
import grpc
import pytest
from safetensors.torch import save_file

from harness.weights_util import random_weights, spec, tensor_bytes, version
from rollout.v1 import rollout_pb2_grpc
from rollout_client import RolloutError, pb
from rollout_codecs import wire

PROMPT = list(range(40, 120))


def output(client):
    r = client.generate(prompt_token_ids=PROMPT, max_tokens=12, temperature=0)
    return r.weight_version, list(r.completions[0].token_ids), list(r.completions[0].logprobs)


@pytest.fixture(scope="module")
def weights(info):
    return random_weights(info.parameters, seed=2001)


@pytest.fixture(scope="module")
def expected(client, info, weights):
    """The output on `weights`, pushed the plain way (one stream)."""
    client.update_weights(random_weights(info.parameters, seed=2002), version())
    client.update_weights(weights, version())
    return output(client)[1:]


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.target) as ch:
        yield rollout_pb2_grpc.RolloutServiceStub(ch)


def _reset_to_other(client, info):
    client.update_weights(random_weights(info.parameters, seed=2003), version())


def test_four_parallel_streams_load_the_same_weights(client, info, weights, expected):
    _reset_to_other(client, info)
    v = version()
    ack = client.update_weights(weights, v, streams=4)
    assert ack.weight_version == v and ack.tensors_loaded == len(weights)
    assert output(client) == (v, *expected)


def test_the_same_host_handoff_loads_the_same_weights_from_a_file(
    client, info, weights, expected, tmp_path
):
    path = tmp_path / "w.safetensors"
    save_file({k: t.contiguous() for k, t in weights.items()}, path)
    _reset_to_other(client, info)
    v = version()
    ack = client.update_weights(str(path), v, same_host=True, checksum=True)
    assert ack.bytes_received == sum(t.nbytes for t in weights.values())
    assert output(client) == (v, *expected)


def test_the_staging_region_is_the_servers_users_alone(stub, weights):
    name, t = next(iter(weights.items()))
    opened = stub.BeginUpdate(
        pb.BeginUpdateRequest(
            begin=pb.UpdateWeightsBegin(weight_version=version(), tensors=[spec(name, t)]),
            same_host=True,
        )
    )
    try:
        mode = os.stat(opened.shared_staging.path).st_mode
        assert stat.S_IMODE(mode) == 0o600
        assert os.stat(opened.shared_staging.path).st_uid == os.geteuid()
    finally:
        stub.AbortUpdate(pb.AbortUpdateRequest(update_id=opened.update_id))


def test_a_broken_upload_resumes_with_the_missing_ranges(
    client, server, stub, info, weights, expected
):
    _reset_to_other(client, info)
    names = list(weights)
    v = version()
    opened = stub.BeginUpdate(
        pb.BeginUpdateRequest(
            begin=pb.UpdateWeightsBegin(
                weight_version=v, tensors=[spec(n, weights[n]) for n in names]
            )
        )
    )
    uid = opened.update_id
    pieces = [
        (i, off, tensor_bytes(weights[n])[off : off + 4096])
        for i, n in enumerate(names)
        for off in range(0, weights[n].numel() * 2, 4096)
    ]
    half = len(pieces) // 2
    sent = threading.Event()

    def broken():
        for i, off, data in pieces[:half]:
            yield wire.upload_chunk(uid, i, off, data)
        sent.set()
        threading.Event().wait(30)  # the connection breaks while this waits

    with grpc.insecure_channel(server.target) as ch:
        upload = ch.stream_unary(
            "/rollout.v1.RolloutService/UploadChunks",
            request_serializer=None,
            response_deserializer=pb.UploadChunksResponse.FromString,
        )
        future = upload.future(broken(), timeout=60)
        assert sent.wait(30)
        # Committing now is refused, and the update stays open.
        status = stub.GetUpdateStatus(pb.GetUpdateStatusRequest(update_id=uid))
        while status.bytes_received < sum(len(p[2]) for p in pieces[:half]):
            status = stub.GetUpdateStatus(pb.GetUpdateStatusRequest(update_id=uid))
        future.cancel()
    with pytest.raises(grpc.RpcError) as e:
        stub.CommitUpdate(pb.CommitUpdateRequest(update_id=uid))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "received" in e.value.details()

    status = stub.GetUpdateStatus(pb.GetUpdateStatusRequest(update_id=uid))
    missing = {(r.tensor_index, r.offset, r.length) for r in status.missing}
    unsent: dict[int, list[tuple[int, int]]] = {}
    for i, off, data in pieces[half:]:
        unsent.setdefault(i, []).append((off, len(data)))
    merged = set()
    for i, ranges in unsent.items():
        start, end = ranges[0][0], ranges[-1][0] + ranges[-1][1]
        merged.add((i, start, end - start))
    assert missing == merged, "the server names exactly the ranges never delivered"

    def rest():
        for r in status.missing:
            data = tensor_bytes(weights[names[r.tensor_index]])
            for off in range(r.offset, r.offset + r.length, 4096):
                end = min(off + 4096, r.offset + r.length)
                yield pb.UploadChunksRequest(
                    update_id=uid,
                    chunk=pb.TensorChunk(
                        tensor_index=r.tensor_index, offset=off, data=data[off:end]
                    ),
                )

    stub.UploadChunks(rest())
    ack = stub.CommitUpdate(pb.CommitUpdateRequest(update_id=uid)).result
    assert ack.weight_version == v
    assert output(client) == (v, *expected)
    again = stub.CommitUpdate(pb.CommitUpdateRequest(update_id=uid)).result  # a retried commit
    assert again.replayed and again.weight_version == v


def test_one_update_at_a_time_and_abort_frees_the_region(client, stub, weights):
    name, t = next(iter(weights.items()))
    begin = pb.UpdateWeightsBegin(weight_version=version(), tensors=[spec(name, t)])
    first = stub.BeginUpdate(pb.BeginUpdateRequest(begin=begin))
    with pytest.raises(grpc.RpcError) as e:
        stub.BeginUpdate(pb.BeginUpdateRequest(begin=begin))
    assert e.value.code() == grpc.StatusCode.ABORTED
    with pytest.raises(RolloutError) as e:  # UpdateWeights too
        client.update_weights({name: t}, version())
    assert e.value.code == grpc.StatusCode.ABORTED
    before = output(client)
    stub.AbortUpdate(pb.AbortUpdateRequest(update_id=first.update_id))
    assert output(client) == before  # nothing applied
    with pytest.raises(grpc.RpcError) as e:
        stub.CommitUpdate(pb.CommitUpdateRequest(update_id=first.update_id))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "not open" in e.value.details()
    second = stub.BeginUpdate(pb.BeginUpdateRequest(begin=begin))
    stub.AbortUpdate(pb.AbortUpdateRequest(update_id=second.update_id))


def test_a_bad_chunk_ends_its_stream_and_leaves_the_update_open(stub, weights):
    name, t = next(iter(weights.items()))
    data = tensor_bytes(t)
    opened = stub.BeginUpdate(
        pb.BeginUpdateRequest(
            begin=pb.UpdateWeightsBegin(weight_version=version(), tensors=[spec(name, t)])
        )
    )
    uid = opened.update_id
    try:
        with pytest.raises(grpc.RpcError) as e:
            stub.UploadChunks(
                iter(
                    [
                        pb.UploadChunksRequest(
                            update_id=uid, chunk=pb.TensorChunk(offset=len(data) - 2, data=b"xxxx")
                        )
                    ]
                )
            )
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "past" in e.value.details()
        status = stub.GetUpdateStatus(pb.GetUpdateStatusRequest(update_id=uid))
        assert status.bytes_received == 0 and status.total_bytes == len(data)
    finally:
        stub.AbortUpdate(pb.AbortUpdateRequest(update_id=uid))


def test_a_batch_of_chunks_uploads_as_its_chunks_and_a_bad_one_is_named(client, stub, weights):
    """UploadChunksRequest.chunks: the server says it takes them; chunk and
    chunks together, or a bad chunk in a batch, are refused naming the field."""
    assert client.server_info().accepts_chunk_batches
    name, t = next(iter(weights.items()))
    data = tensor_bytes(t)
    v = version()
    begin = pb.UpdateWeightsBegin(weight_version=v, tensors=[spec(name, t)])
    uid = stub.BeginUpdate(pb.BeginUpdateRequest(begin=begin)).update_id
    third = len(data) // 3
    pieces = [(0, third), (third, 2 * third)]

    def batch(ranges) -> pb.TensorChunkBatch:
        return pb.TensorChunkBatch(
            chunks=[pb.TensorChunk(offset=a, data=data[a:b]) for a, b in ranges]
        )

    try:
        for req, field in [
            (pb.UploadChunksRequest(update_id=uid, chunks=batch(pieces), chunk=pb.TensorChunk()),
             "chunks: set chunk or chunks"),
            (pb.UploadChunksRequest(update_id=uid, chunks=batch([(0, 4), (2, 6)])),
             "chunks.chunks[1].offset"),
        ]:  # fmt: skip
            with pytest.raises(grpc.RpcError) as e:
                stub.UploadChunks(iter([req]))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
            assert field in e.value.details()
        # The refused batch's first chunk landed, as its own message would have:
        # what is missing says so, and the rest completes the tensor.
        status = stub.GetUpdateStatus(pb.GetUpdateStatusRequest(update_id=uid))
        assert [(r.offset, r.length) for r in status.missing] == [(4, len(data) - 4)]
        rest = [(4, third), (third, 2 * third), (2 * third, len(data))]
        got = stub.UploadChunks(iter([pb.UploadChunksRequest(update_id=uid, chunks=batch(rest))]))
        assert got.bytes_received == len(data) - 4
        ack = stub.CommitUpdate(pb.CommitUpdateRequest(update_id=uid)).result
        assert ack.weight_version == v == client.server_info().weight_version
        uid = ""
    finally:
        if uid:
            stub.AbortUpdate(pb.AbortUpdateRequest(update_id=uid))


def test_a_sharded_checkpoint_folder_streams_tensor_by_tensor(
    client, info, weights, expected, tmp_path
):
    names = list(weights)
    half = len(names) // 2
    for i, part in enumerate((names[:half], names[half:])):
        save_file({n: weights[n].contiguous() for n in part}, tmp_path / f"model-{i}.safetensors")
    _reset_to_other(client, info)
    v = version()
    ack = client.update_weights(str(tmp_path), v)
    assert ack.tensors_loaded == len(names)
    assert output(client) == (v, *expected)


def _refused_for_a_checksum(stub, name, t) -> str:
    """A staged update of `t` whose uploaded bytes do not match its declared
    CRC-32C; its commit refused. Returns its id."""
    data = tensor_bytes(t)
    opened = stub.BeginUpdate(
        pb.BeginUpdateRequest(
            begin=pb.UpdateWeightsBegin(
                weight_version=version(), tensors=[spec(name, t, crc32c=crc32c.crc32c(data))]
            )
        )
    )
    uid = opened.update_id
    corrupt = bytes([data[0] ^ 1]) + data[1:]
    stub.UploadChunks(iter([_upload(uid, corrupt)]))
    with pytest.raises(grpc.RpcError) as e:
        stub.CommitUpdate(pb.CommitUpdateRequest(update_id=uid))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "checksum" in e.value.details()
    return uid


def _upload(uid: str, data: bytes) -> pb.UploadChunksRequest:
    return pb.UploadChunksRequest(update_id=uid, chunk=pb.TensorChunk(offset=0, data=data))


def test_a_checksum_mismatch_leaves_the_update_open_for_corrected_bytes(client, stub, weights):
    name, t = next(iter(weights.items()))
    uid = _refused_for_a_checksum(stub, name, t)
    status = stub.GetUpdateStatus(pb.GetUpdateStatusRequest(update_id=uid))
    missing = [(r.tensor_index, r.offset, r.length) for r in status.missing]
    assert missing == [(0, 0, t.nbytes)], "the tensor's bytes count as missing again"
    stub.UploadChunks(iter([_upload(uid, tensor_bytes(t))]))
    ack = stub.CommitUpdate(pb.CommitUpdateRequest(update_id=uid)).result
    assert client.server_info().weight_version == ack.weight_version


def test_a_refused_commit_does_not_hold_the_update_slot(client, stub, weights):
    name, t = next(iter(weights.items()))
    uid = _refused_for_a_checksum(stub, name, t)
    # The next update takes the slot at once: no AbortUpdate, no idle timeout.
    ack = client.update_weights({name: t}, version())
    assert client.server_info().weight_version == ack.weight_version
    with pytest.raises(grpc.RpcError) as e:
        stub.GetUpdateStatus(pb.GetUpdateStatusRequest(update_id=uid))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "not open" in e.value.details()
