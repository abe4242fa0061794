"""An update arriving while its identical twin is being applied, against the
real engine: the retry of a client whose call was cancelled after its
commit (a network blip) waits for the twin and gets its acknowledgement,
through UpdateWeights, a retried CommitUpdate or a whole staged retry; a
different update is still refused at once; when the twin fails, a waiter
gets its failure or applies cleanly afterwards, never a mixed state.

The apply is held inside the engine's load for exactly as long as a test
needs by the fault file's "stall" (weights_backend.FAULT_FILE_ENV)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import crc32c
import grpc
import pytest

from harness.weights_util import COMMIT, chunk, random_weights, spec, tensor_bytes, version
from rollout.v1 import rollout_pb2_grpc
from rollout_client import RolloutError, pb
from rollout_service.update.transfers import could_be_twins
from tests.support.stall import stalled, wait_stalled

# Long enough to show that a waiter waits; a refusal comes in milliseconds.
WAITS = 1.0


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.target) as ch:
        yield rollout_pb2_grpc.RolloutServiceStub(ch)


def specs(weights) -> list[pb.TensorSpec]:
    """With checksums, as the client's `checksum=True` declares them."""
    return [spec(n, t, crc32c=crc32c.crc32c(tensor_bytes(t))) for n, t in weights.items()]


def stream(weights, v: str):
    """The UpdateWeights stream the client sends with `checksum=True`."""
    yield pb.UpdateWeightsRequest(
        begin=pb.UpdateWeightsBegin(weight_version=v, tensors=specs(weights))
    )
    for i, t in enumerate(weights.values()):
        data = tensor_bytes(t)
        for off in range(0, len(data), 1 << 16):
            yield chunk(i, off, data[off : off + (1 << 16)])
    yield COMMIT


def stage(stub, weights, v: str) -> str:
    """BeginUpdate and every byte uploaded; returns the update id."""
    uid = stub.BeginUpdate(
        pb.BeginUpdateRequest(begin=pb.UpdateWeightsBegin(weight_version=v, tensors=specs(weights)))
    ).update_id
    stub.UploadChunks(
        pb.UploadChunksRequest(update_id=uid, chunk=m.chunk)
        for m in stream(weights, v)
        if m.HasField("chunk")
    )
    return uid


def refused(call) -> RolloutError:
    with pytest.raises(RolloutError) as e:
        call()
    return e.value


def test_a_retried_update_weights_during_the_apply_gets_the_twins_ack(
    server, client, info, fault_file
):
    weights = random_weights(info.parameters, seed=2401)
    v = version()
    previous = client.server_info().weight_version
    with (
        ThreadPoolExecutor(1) as pool,
        grpc.insecure_channel(server.target) as ch,
        stalled(fault_file),
    ):
        first = rollout_pb2_grpc.RolloutServiceStub(ch).UpdateWeights.future(
            stream(weights, v), timeout=120
        )
        wait_stalled(fault_file)
        first.cancel()  # the blip: the server has the commit and applies regardless
        retry = pool.submit(client.update_weights, weights, v, checksum=True)
        # Updates other than the twin are refused at once, as before.
        e = refused(lambda: client.update_weights(weights, version(), checksum=True))
        assert e.code == grpc.StatusCode.ABORTED and e.reason == "UPDATE_IN_PROGRESS"
        other = {**weights, "lm_head.weight": weights["lm_head.weight"] * 2}
        e = refused(lambda: client.update_weights(other, v, checksum=True))
        assert e.code == grpc.StatusCode.ABORTED and e.reason == "UPDATE_IN_PROGRESS"
        time.sleep(WAITS)
        assert not retry.done(), "the retry waits for its twin"
        fault_file.unlink()
        ack = retry.result(60)
    assert ack.replayed and ack.weight_version == v and ack.previous_weight_version == previous
    assert ack.tensors_loaded == len(weights)
    assert client.server_info().weight_version == v


def test_staged_retries_during_the_apply_get_the_twins_ack(client, stub, info, fault_file):
    weights = random_weights(info.parameters, seed=2402)
    v = version()
    previous = client.server_info().weight_version
    with ThreadPoolExecutor(2) as pool, stalled(fault_file):
        uid = stage(stub, weights, v)
        commit = stub.CommitUpdate.future(pb.CommitUpdateRequest(update_id=uid), timeout=120)
        wait_stalled(fault_file)
        commit.cancel()
        # The commit retried, and the whole update retried (BeginUpdate, two
        # upload streams, CommitUpdate).
        again = pool.submit(stub.CommitUpdate, pb.CommitUpdateRequest(update_id=uid), timeout=120)
        retry = pool.submit(client.update_weights, weights, v, checksum=True, streams=2)
        time.sleep(WAITS)
        assert not again.done() and not retry.done(), "both wait for their twin"
        fault_file.unlink()
        acks = again.result(60).result, retry.result(60)
    for ack in acks:
        assert ack.replayed and ack.weight_version == v and ack.previous_weight_version == previous
    assert client.server_info().weight_version == v


def _held_after_begin(weights, v: str, release: threading.Event):
    """A retry whose begin goes at once and whose bytes wait for `release`."""
    messages = stream(weights, v)
    yield next(messages)
    release.wait(60)
    yield from messages


def test_when_the_twin_fails_its_commit_shares_the_failure_and_a_retry_applies_cleanly(
    server, client, stub, info, fault_file
):
    weights = random_weights(info.parameters, seed=2403)
    v = version()
    release = threading.Event()
    with (
        ThreadPoolExecutor(1) as pool,
        grpc.insecure_channel(server.target) as ch,
        stalled(fault_file),
    ):
        uid = stage(stub, weights, v)
        commit = stub.CommitUpdate.future(pb.CommitUpdateRequest(update_id=uid), timeout=120)
        wait_stalled(fault_file)
        again = pool.submit(stub.CommitUpdate, pb.CommitUpdateRequest(update_id=uid), timeout=120)
        retry = rollout_pb2_grpc.RolloutServiceStub(ch).UpdateWeights.future(
            _held_after_begin(weights, v, release), timeout=120
        )
        time.sleep(WAITS)
        assert not again.done() and not retry.done(), "both wait for their twin"
        fault_file.write_text("0")  # the twin fails inside the engine
        for failed in (commit, again):
            with pytest.raises(grpc.RpcError) as e:
                failed.result(60)
            assert e.value.code() == grpc.StatusCode.INTERNAL and "degraded" in e.value.details()
        fault_file.unlink()
        assert client.server_info().degraded
        release.set()  # the retry took the slot after the failure: its bytes now
        ack = retry.result(60)
    assert not ack.replayed and ack.weight_version == v and ack.previous_weight_version == ""
    s = client.server_info()
    assert not s.degraded and s.weight_version == v


def test_which_begins_may_be_twins():
    """From begins alone (no engine): a checksum declared on one side only
    leaves the bytes to decide; anything else that differs is another update."""
    a = pb.TensorSpec(name="a", dtype=pb.D_TYPE_BFLOAT16, shape=[4])
    b = pb.TensorSpec(name="b", dtype=pb.D_TYPE_BFLOAT16, shape=[2])

    def begin(*tensors, v="v1", **kw):
        return pb.UpdateWeightsBegin(weight_version=v, tensors=tensors, **kw)

    def crc(t, value):
        out = pb.TensorSpec()
        out.CopyFrom(t)
        out.crc32c = value
        return out

    one = begin(crc(a, 1), b)
    assert could_be_twins(one, begin(crc(a, 1), b, pause_mode=pb.PAUSE_MODE_ABORT))
    assert could_be_twins(one, begin(a, crc(b, 2)))
    assert not could_be_twins(one, begin(crc(a, 3), b))
    assert not could_be_twins(one, begin(crc(a, 1), b, v="v2"))
    assert not could_be_twins(one, begin(b, crc(a, 1)))
    assert not could_be_twins(one, begin(crc(a, 1)))
    assert not could_be_twins(one, begin(crc(a, 1), b, adapter=pb.AdapterTarget(name="x")))
