"""An update that does not apply costs the delta base only the slots it wrote
(update/delta_base.py): a full update begun and ended before any byte came
in (a staged update aborted, a stream cut after its begin) leaves
GetServerInfo.delta_base_version as it was, and a delta against it serves
what a fresh engine on the same weights serves. One aborted after a byte of a
tensor came in, by a chunk or by a same-host write, serves what it served but
no longer offers the base: a delta naming it is refused
(DELTA_BASE_MISMATCH) and the client pushes in full, which offers it again.

The session server takes the updates; the reference server (a fresh engine
on the simulated training's last step, tests/conftest.py) the full pushes."""

from __future__ import annotations

import crc32c
import grpc
import pytest

from harness.weights_util import spec, tensor_bytes, version
from rollout_client import RolloutClient, RolloutError, pb
from tests.support.delta_steps import initial, simulate
from tests.support.greedy import assert_same, served

# A tensor of no fused group, small: a few of its bytes are written.
TENSOR = "model.norm.weight"


@pytest.fixture(scope="module")
def client(server):
    """This module's own client: its record of what it pushed stays here."""
    with RolloutClient(server.target, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def steps():
    return simulate(initial(), steps=2)


@pytest.fixture(scope="module")
def reference(delta_reference):
    with RolloutClient(delta_reference.target, timeout=120) as c:
        yield c


def checked(name: str, t) -> pb.TensorSpec:
    """`name`'s spec, declaring the CRC-32C of `t`'s bytes."""
    return spec(name, t, crc32c=crc32c.crc32c(tensor_bytes(t)))


def full_begin(weights: dict) -> pb.UpdateWeightsBegin:
    """A full update of every tensor of `weights`."""
    specs = [checked(n, t) for n, t in weights.items()]
    return pb.UpdateWeightsBegin(weight_version=version(), tensors=specs)


def pushed_in_full(client: RolloutClient, weights: dict) -> str:
    """Pushes `weights` in full (the client's first push keeps its copy, for
    the deltas after); the base it offers."""
    client.pushed = None
    ack = client.update_weights(weights, version(), delta="always")
    assert ack.timings.decode_seconds == 0
    base = client.server_info().delta_base_version
    assert base == ack.weight_version
    return base


def test_an_update_ended_before_any_byte_keeps_the_base_and_a_delta_serves_right(
    client, reference, steps
):
    base = pushed_in_full(client, steps[0])
    stub = client.stub
    # Staged: begun over every tensor, then aborted.
    opened = stub.BeginUpdate(pb.BeginUpdateRequest(begin=full_begin(steps[1])), timeout=60)
    stub.AbortUpdate(pb.AbortUpdateRequest(update_id=opened.update_id), timeout=60)
    assert client.server_info().delta_base_version == base
    # One stream, cut after its begin: refused at its end, nothing written.
    with pytest.raises(grpc.RpcError) as e:
        stub.UpdateWeights(iter([pb.UpdateWeightsRequest(begin=full_begin(steps[1]))]), timeout=60)
    cut = RolloutError.wrap(e.value)
    assert cut.code == grpc.StatusCode.INVALID_ARGUMENT and cut.details.startswith("commit:")
    info = client.server_info()
    assert (info.weight_version, info.delta_base_version) == (base, base)
    ack = client.update_weights(steps[1], version(), delta="always")
    assert ack.timings.decode_seconds > 0, "went in full: the base was not offered"
    assert ack.previous_weight_version == base
    assert client.server_info().delta_base_version == ack.weight_version
    reference.update_weights(steps[1], version())
    assert_same(served(client), served(reference))


def _upload_a_few_bytes(stub, begin: pb.UpdateWeightsBegin, index: int) -> None:
    opened = stub.BeginUpdate(pb.BeginUpdateRequest(begin=begin), timeout=60)
    chunk = pb.TensorChunk(tensor_index=index, offset=0, data=b"\x7f" * 16)
    try:
        sent = stub.UploadChunks(
            iter([pb.UploadChunksRequest(update_id=opened.update_id, chunk=chunk)]), timeout=60
        )
        assert sent.bytes_received == 16
    finally:
        stub.AbortUpdate(pb.AbortUpdateRequest(update_id=opened.update_id), timeout=60)


def _write_a_few_bytes_same_host(stub, begin: pb.UpdateWeightsBegin, index: int) -> None:
    opened = stub.BeginUpdate(pb.BeginUpdateRequest(begin=begin, same_host=True), timeout=60)
    try:
        with open(opened.shared_staging.path, "r+b") as region:
            region.seek(opened.shared_staging.tensor_offsets[index])
            region.write(b"\x7f" * 16)
    finally:
        stub.AbortUpdate(pb.AbortUpdateRequest(update_id=opened.update_id), timeout=60)


@pytest.mark.parametrize("write", [_upload_a_few_bytes, _write_a_few_bytes_same_host])
def test_an_update_aborted_after_some_bytes_serves_as_before_but_offers_no_base(
    client, reference, steps, write
):
    base = pushed_in_full(client, steps[0])
    stub = client.stub
    before = served(client)
    begin = full_begin(steps[1])
    write(stub, begin, [t.name for t in begin.tensors].index(TENSOR))
    info = client.server_info()
    assert (info.weight_version, info.delta_base_version) == (base, "")
    assert_same(served(client), before, noise=0.0)  # nothing was loaded
    # A delta naming the base is refused before anything is read or written.
    delta_begin = pb.UpdateWeightsBegin(
        weight_version=version(),
        base_version=base,
        tensors=[checked(TENSOR, steps[1][TENSOR])],
    )
    with pytest.raises(grpc.RpcError) as e:
        stub.BeginUpdate(pb.BeginUpdateRequest(begin=delta_begin), timeout=60)
    refusal = RolloutError.wrap(e.value)
    assert (refusal.code, refusal.reason) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "DELTA_BASE_MISMATCH",
    )
    assert "stale" in refusal.details
    # The client's delta falls back to a full push, which offers a base again.
    ack = client.update_weights(steps[1], version(), delta="always")
    assert ack.timings.decode_seconds == 0
    assert ack.bytes_received == sum(len(tensor_bytes(t)) for t in steps[1].values())
    assert client.server_info().delta_base_version == ack.weight_version
    reference.update_weights(steps[1], version())
    assert_same(served(client), served(reference))
