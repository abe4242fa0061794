"""Delta updates against the real engine (UpdateWeightsBegin.base_version):
twenty simulated RL steps pushed as deltas serve exactly what full pushes of
the same weights serve, and at the end what a fresh engine started on them
serves; a delta against another base, or one whose bytes do not reconstruct
the declared CRC-32C, is refused with the served weights and the base
untouched, and the client falls back to a full push on its own; a delta
retried after its call was cancelled is replayed; a failure inside the engine
mid-delta leaves the server degraded, and a full update then serves what a
fresh engine does.

The session server takes the deltas; a reference server started on the last
step's weights (tests/conftest.py) takes the full pushes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import crc32c
import grpc
import numpy as np
import psutil
import pytest
import torch

from harness.weights_util import COMMIT, chunk, spec, tensor_bytes, version
from rollout.v1 import rollout_pb2_grpc
from rollout_client import RolloutClient, RolloutError, pb
from rollout_codecs import delta
from tests.support.cpus import thread_cpus, vllm_process
from tests.support.delta_steps import initial, simulate
from tests.support.greedy import assert_same, served
from tests.support.stall import stalled, wait_stalled


@pytest.fixture(scope="module")
def client(server):
    """This module's own client: its record of what it pushed (`pushed`)
    stays here."""
    with RolloutClient(server.target, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def steps():
    return simulate(initial())


@pytest.fixture(scope="module")
def reference(delta_reference):
    """A fresh engine started on the last step's weights (tests/conftest.py)."""
    with RolloutClient(delta_reference.target, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.target) as ch:
        yield rollout_pb2_grpc.RolloutServiceStub(ch)


def full_push(c: RolloutClient, weights: dict) -> str:
    v = version()
    c.update_weights(weights, v)
    return v


def test_twenty_delta_steps_serve_what_full_pushes_and_a_fresh_engine_serve(
    client, reference, steps
):
    fresh = served(reference)  # before anything is pushed to it
    # The engine's own run-to-run noise, measured: the same weights twice.
    assert_same(served(reference), fresh, noise=0.0)
    first = client.update_weights(steps[0], version(), delta="always")
    assert client.pushed is not None and client.pushed.version == first.weight_version
    wire = []
    for i, weights in enumerate(steps[1:], start=1):
        ack = client.update_weights(weights, f"delta-{i}-{version()}", delta="always")
        info = client.server_info()
        assert info.delta_base_version == ack.weight_version == client.pushed.version
        assert ack.timings.decode_seconds > 0, f"step {i} went as a full update"
        wire.append(ack.bytes_received / info.delta_base_bytes)
        full_push(reference, weights)
        assert_same(served(client), served(reference))
    assert_same(served(client), fresh)
    # About a tenth of the values change a step: 12-20 % of the bytes travel
    # (SPARSE_XOR8's 2 bytes per change, a few small tensors raw).
    assert max(wire) < 0.3, f"wire share per step: {wire}"


def test_a_delta_against_another_base_is_refused_untouched_and_the_client_falls_back(
    client, stub, steps
):
    client.update_weights(steps[0], version(), delta="always")
    info = client.server_info()
    before = served(client)
    bad = pb.UpdateWeightsBegin(
        weight_version=version(),
        base_version="not-the-base",
        tensors=[spec_of("model.norm.weight", steps[1])],
    )
    with pytest.raises(grpc.RpcError) as e:
        stub.UpdateWeights(iter([pb.UpdateWeightsRequest(begin=bad), COMMIT]), timeout=60)
    refusal = RolloutError.wrap(e.value)
    assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION
    assert refusal.reason == "DELTA_BASE_MISMATCH"
    assert "'not-the-base' is not this server's delta base" in refusal.details
    after = client.server_info()
    assert (after.weight_version, after.delta_base_version) == (
        info.weight_version,
        info.delta_base_version,
    )
    assert_same(served(client), before, noise=0.0)
    # The client's record says another version: it pushes in full.
    assert client.pushed is not None
    client.pushed.version = "not-the-base"
    ack = client.update_weights(steps[1], version(), delta="always")
    assert ack.bytes_received == sum(len(tensor_bytes(t)) for t in steps[1].values())
    assert ack.timings.decode_seconds == 0
    assert client.pushed.version == ack.weight_version == client.server_info().delta_base_version


def spec_of(name: str, weights: dict, **kw) -> pb.TensorSpec:
    """`name`'s spec in `weights`, declaring the CRC-32C of its bytes."""
    t = weights[name]
    return spec(name, t, crc32c=crc32c.crc32c(tensor_bytes(t)), **kw)


def delta_stream(
    base_version: str,
    v: str,
    names: str | list[str],
    old: dict,
    new: dict,
    crc_delta: int = 0,
    wrong: str | None = None,
):
    """A SPARSE_XOR16 delta stream of `names` from `old` to `new`; the
    CRC-32C declared for `wrong` (default: the first) is off by `crc_delta`."""
    names = [names] if isinstance(names, str) else names
    wrong = wrong or names[0]
    specs, payloads = [], []
    for name in names:
        words = [np.frombuffer(tensor_bytes(w[name]), "<u2") for w in (old, new)]
        data = delta.encode_sparse(*words).tobytes()
        s = spec_of(name, new, encoding=delta.SPARSE, encoded_bytes=len(data))
        if name == wrong:
            s.crc32c = (s.crc32c + crc_delta) & 0xFFFFFFFF
        specs.append(s)
        payloads.append(data)
    begin = pb.UpdateWeightsBegin(weight_version=v, base_version=base_version, tensors=specs)
    yield pb.UpdateWeightsRequest(begin=begin)
    for i, data in enumerate(payloads):
        for off in range(0, len(data), 1 << 14):
            yield chunk(i, off, data[off : off + (1 << 14)])
    yield COMMIT


def test_a_delta_that_reconstructs_the_wrong_crc_is_refused_and_the_base_is_intact(
    client, stub, steps
):
    client.update_weights(steps[0], version(), delta="always")
    base = client.server_info().delta_base_version
    before = served(client)
    name = "lm_head.weight"
    with pytest.raises(grpc.RpcError) as e:
        stub.UpdateWeights(delta_stream(base, version(), name, steps[0], steps[1], 1), timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "begin.tensors[0].crc32c" in e.value.details()
    assert "the base is untouched" in e.value.details()
    assert client.server_info().delta_base_version == base
    assert_same(served(client), before, noise=0.0)
    # The same delta, declared right, applies on the intact base.
    ack = stub.UpdateWeights(delta_stream(base, version(), name, steps[0], steps[1]), timeout=60)
    assert ack.timings.decode_seconds > 0
    client.pushed = None  # the record no longer matches what is served


def test_one_wrong_tensor_among_many_refuses_the_whole_delta_and_the_worker_cores_come_back(
    server, client, stub, reference, steps
):
    """A delta is decoded a group of tensors at a time while the engine
    loads the group before (delta_load.py), the first group on threads that
    borrow the worker's cores: one wrong CRC-32C in the last tensor is found
    after the engine loaded the others, and still refuses the whole update
    with the base intact and the engine serving what it served, names that
    tensor, and every thread of the server is back off the worker's cores."""
    client.update_weights(steps[0], version(), delta="always")
    base = client.server_info().delta_base_version
    before = served(client)
    names = [
        n
        for n, t in steps[1].items()
        if t.dtype == torch.bfloat16 and not torch.equal(t, steps[0][n])
    ]
    assert len(names) > 4, names
    wrong = names[-1]
    with pytest.raises(grpc.RpcError) as e:
        stub.UpdateWeights(
            delta_stream(base, version(), names, steps[0], steps[1], 1, wrong), timeout=60
        )
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"begin.tensors[{len(names) - 1}].crc32c" in e.value.details()
    assert not client.server_info().degraded
    assert client.server_info().delta_base_version == base
    assert_same(served(client), before, noise=0.0)
    ack = stub.UpdateWeights(delta_stream(base, version(), names, steps[0], steps[1]), timeout=60)
    assert ack.timings.decode_seconds > 0
    client.pushed = None
    full_push(reference, steps[1])
    assert_same(served(client), served(reference))
    root = psutil.Process(server.proc.pid)
    worker = thread_cpus(vllm_process(root, "VLLM::Worker"))
    assert not thread_cpus(root) & worker, "a server thread stayed on the worker's cores"


def test_a_tensor_sent_in_more_separate_ranges_than_the_bound_is_refused_untouched(
    client, stub, steps
):
    """Each separate range of a tensor's received bytes costs the server a
    sorted insertion: at most 65,536 per tensor (upload.MAX_RANGES). A
    delta's encoded bytes may be twice its tensor's, so one 1-byte chunk at
    every other offset reaches the bound on the embedded model's largest
    tensor; the next chunk is refused naming its place in the batch, and
    nothing is served differently."""
    from rollout_service.update.upload import MAX_RANGES

    client.update_weights(steps[0], version(), delta="always")
    base = client.server_info().delta_base_version
    before = served(client)
    name = max(steps[0], key=lambda n: steps[0][n].numel() * steps[0][n].element_size())
    nbytes = len(tensor_bytes(steps[0][name]))
    encoded = delta.max_encoded_bytes(delta.SPARSE8, nbytes)
    assert encoded >= 2 * (MAX_RANGES + 1), (name, nbytes)
    s = spec_of(name, steps[1], encoding=delta.SPARSE8, encoded_bytes=encoded)
    begin = pb.UpdateWeightsBegin(weight_version=version(), base_version=base, tensors=[s])

    def stream():
        yield pb.UpdateWeightsRequest(begin=begin)
        offsets = list(range(0, 2 * (MAX_RANGES + 1), 2))
        for at in range(0, len(offsets), 1024):
            batch = [
                pb.TensorChunk(tensor_index=0, offset=o, data=b"x") for o in offsets[at : at + 1024]
            ]
            yield pb.UpdateWeightsRequest(chunks=pb.TensorChunkBatch(chunks=batch))
        yield COMMIT

    with pytest.raises(grpc.RpcError) as e:
        stub.UpdateWeights(stream(), timeout=120)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"chunks.chunks[{MAX_RANGES % 1024}].offset" in e.value.details()
    assert f"form {MAX_RANGES} separate ranges" in e.value.details()
    assert client.server_info().delta_base_version == base
    assert_same(served(client), before, noise=0.0)


def test_a_delta_cancelled_after_commit_and_retried_is_replayed(client, stub, steps, fault_file):
    client.update_weights(steps[0], version(), delta="always")
    base = client.server_info().delta_base_version
    v = version()
    name = "lm_head.weight"
    with ThreadPoolExecutor(1) as pool, stalled(fault_file):
        first = stub.UpdateWeights.future(
            delta_stream(base, v, name, steps[0], steps[1]), timeout=120
        )
        wait_stalled(fault_file)
        first.cancel()
        retry = pool.submit(
            stub.UpdateWeights, delta_stream(base, v, name, steps[0], steps[1]), timeout=120
        )
        fault_file.unlink()
        ack = retry.result(60)
    assert ack.replayed and ack.weight_version == v and ack.previous_weight_version == base
    # Once more, after the apply: still the same acknowledgement.
    again = stub.UpdateWeights(delta_stream(base, v, name, steps[0], steps[1]), timeout=60)
    assert again.replayed and client.server_info().delta_base_version == v
    client.pushed = None


def test_a_failure_inside_the_engine_mid_delta_then_a_full_update_serves_a_fresh_engine(
    client, reference, steps, fault_file
):
    client.update_weights(steps[0], version(), delta="always")
    fault_file.write_text("1")  # fails after one tensor is loaded
    try:
        with pytest.raises(RolloutError) as e:
            client.update_weights(steps[1], version(), delta="always")
    finally:
        fault_file.unlink(missing_ok=True)
    assert e.value.code == grpc.StatusCode.INTERNAL and e.value.reason == "ENGINE_FAILURE"
    info = client.server_info()
    assert info.degraded and info.delta_base_version == ""
    # The client's next delta is refused (no base) and goes in full.
    ack = client.update_weights(steps[-1], version(), delta="always")
    assert ack.timings.decode_seconds == 0 and not client.server_info().degraded
    full_push(reference, steps[-1])
    assert_same(served(client), served(reference))


@pytest.mark.parametrize("how", [{"streams": 2}, {"same_host": True}])
def test_staged_and_same_host_deltas_serve_what_a_full_push_serves(client, reference, steps, how):
    client.update_weights(steps[2], version(), delta="always", **how)
    ack = client.update_weights(steps[3], version(), delta="always", **how)
    assert ack.timings.decode_seconds > 0
    assert client.server_info().delta_base_version == ack.weight_version
    full_push(reference, steps[3])
    assert_same(served(client), served(reference))
