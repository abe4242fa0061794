"""UpdateWeights and ResetCaches against the real engine: never stale, all
or nothing, one at a time."""

from __future__ import annotations

import random
import threading
import time

import grpc
import pytest

from harness.weights_util import (
    COMMIT,
    begin,
    chunk,
    full_stream,
    random_weights,
    spec,
    tensor_bytes,
    version,
)
from rollout.v1 import rollout_pb2_grpc
from rollout_client import RolloutError, pb
from tests.support import weights_reference

# Several KV blocks long, so most of it lands in the prefix cache.
LONG_PROMPT = [random.Random(0).randrange(10, 500) for _ in range(200)]


def greedy(client, prompt=LONG_PROMPT, max_tokens=16):
    return client.generate(prompt_token_ids=prompt, max_tokens=max_tokens, temperature=0)


def tokens_and_logprobs(r):
    c = r.completions[0]
    return list(c.token_ids), list(c.logprobs)


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(server.target, options=[("grpc.max_send_message_length", -1)])
    yield rollout_pb2_grpc.RolloutServiceStub(channel)
    channel.close()


@pytest.fixture(scope="module")
def new_weights(info):
    weights = weights_reference.new_weights()
    assert set(weights) == {p.name for p in info.parameters}, "every tensor the server serves"
    return weights


def test_update_is_never_stale_text(client, new_weights, weights_reference_server):
    greedy(client)
    warm = greedy(client)
    assert warm.usage.cached_prompt_tokens >= 128, "the prompt must come from the prefix cache"

    ack = client.update_weights(new_weights, version())
    assert ack.tensors_loaded == len(new_weights)
    assert {r.cache for r in ack.caches_reset if r.reset} == {
        pb.CACHE_KIND_PREFIX,
        pb.CACHE_KIND_MULTIMODAL,
        pb.CACHE_KIND_ENCODER,
    }
    after = greedy(client)
    assert after.weight_version == ack.weight_version
    assert after.usage.cached_prompt_tokens == 0, "the prefix cache must be empty after an update"

    from rollout_client import RolloutClient

    with RolloutClient(weights_reference_server.target) as fresh:
        expected = greedy(fresh)
    got_tokens, got_logprobs = tokens_and_logprobs(after)
    want_tokens, want_logprobs = tokens_and_logprobs(expected)
    assert got_tokens == want_tokens
    assert got_logprobs == pytest.approx(want_logprobs, abs=1e-6)
    assert tokens_and_logprobs(warm) != (got_tokens, got_logprobs)


def test_reset_caches_empties_the_prefix_cache(client):
    greedy(client)
    assert greedy(client).usage.cached_prompt_tokens >= 128
    before = tokens_and_logprobs(greedy(client))
    r = client.reset_caches()
    assert [(x.cache, x.reset) for x in r.results] == [
        (pb.CACHE_KIND_PREFIX, True),
        (pb.CACHE_KIND_MULTIMODAL, True),
        (pb.CACHE_KIND_ENCODER, True),
    ]
    after = greedy(client)
    assert after.usage.cached_prompt_tokens == 0
    assert tokens_and_logprobs(after) == before  # same weights, same output


def test_partial_update_changes_only_what_it_names_and_resets_caches(client, info):
    greedy(client)
    assert greedy(client).usage.cached_prompt_tokens > 0
    before = tokens_and_logprobs(greedy(client))
    head = [p for p in info.parameters if p.name == "lm_head.weight"]
    ack = client.update_weights(random_weights(head, seed=7), version())
    assert ack.tensors_loaded == 1
    after = greedy(client)
    assert after.usage.cached_prompt_tokens == 0
    assert after.weight_version == ack.weight_version
    assert tokens_and_logprobs(after) != before


def _expect(stub, messages, code, *needles):
    with pytest.raises(grpc.RpcError) as e:
        stub.UpdateWeights(iter(messages), timeout=60)
    assert e.value.code() == code, e.value.details()
    for needle in needles:
        assert needle in e.value.details()


def _bad_streams(info):
    w = random_weights(info.parameters[:2], seed=3)
    (n0, t0), (n1, t1) = w.items()
    b0, b1 = tensor_bytes(t0), tensor_bytes(t1)
    ok = [spec(n0, t0), spec(n1, t1)]
    good = [chunk(0, 0, b0), chunk(1, 0, b1)]
    v = version()
    f32 = t0.float()
    INV, FP = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
    return {
        "unknown name": (
            [begin(v, [spec("model.nonexistent.weight", t0)]), chunk(0, 0, b0), COMMIT],
            INV,
            ["model.nonexistent.weight", "not a parameter"],
        ),
        "wrong dtype": (
            [begin(v, [spec(n0, f32)]), chunk(0, 0, tensor_bytes(f32)), COMMIT],
            INV,
            ["dtype", "D_TYPE_FLOAT32"],
        ),
        "wrong shape": (
            [begin(v, [pb.TensorSpec(name=n0, dtype=pb.D_TYPE_BFLOAT16, shape=[3, 3])]), COMMIT],
            INV,
            ["shape", "[3, 3]"],
        ),
        "chunk past the end": (
            [begin(v, ok), chunk(0, 0, b0), chunk(1, 0, b1 + b"xx"), COMMIT],
            INV,
            ["past", n1],
        ),
        "overlapping chunks": (
            [begin(v, ok), chunk(0, 0, b0), chunk(0, 2, b0[2:4]), chunk(1, 0, b1), COMMIT],
            INV,
            ["overlap", n0],
        ),
        "missing bytes": (
            [begin(v, ok), chunk(0, 0, b0[:-2]), chunk(1, 0, b1), COMMIT],
            INV,
            ["received", n0],
        ),
        "bad checksum": (
            [begin(v, [spec(n0, t0, crc32c=12345), ok[1]]), *good, COMMIT],
            INV,
            ["checksum", n0],
        ),
        "tensor index out of range": (
            [begin(v, ok), chunk(5, 0, b0), COMMIT],
            INV,
            ["tensor_index"],
        ),
        "chunk before begin": ([chunk(0, 0, b0), begin(v, ok), COMMIT], INV, ["begin"]),
        "no commit": ([begin(v, ok), *good], INV, ["without commit"]),
        "empty stream": ([], INV, ["begin"]),
        "two begins": ([begin(v, ok), begin(v, ok), *good, COMMIT], INV, ["two begin"]),
        "message after commit": ([begin(v, ok), *good, COMMIT, chunk(0, 0, b0)], INV, ["after"]),
        "duplicate tensor": ([begin(v, [ok[0], ok[0]]), COMMIT], INV, ["twice"]),
        "empty version": ([begin("", ok), *good, COMMIT], INV, ["weight_version"]),
        "repeated version": ([begin(info.weight_version, ok), *good, COMMIT], FP, ["already"]),
    }


def test_invalid_streams_leave_weights_untouched(client, stub):
    info = client.server_info()
    before = tokens_and_logprobs(greedy(client))
    cases = _bad_streams(info)
    for name, (messages, code, needles) in cases.items():
        try:
            _expect(stub, messages, code, *needles)
        except AssertionError as e:
            raise AssertionError(f"case {name!r}: {e}") from e
        assert client.server_info().weight_version == info.weight_version, name
    assert tokens_and_logprobs(greedy(client)) == before
    assert not client.server_info().degraded


def test_oversize_update_is_refused(weights_reference_server):
    from rollout_client import RolloutClient

    with RolloutClient(weights_reference_server.target) as c:
        info = c.server_info()
        before = tokens_and_logprobs(greedy(c))
        with pytest.raises(RolloutError) as e:
            c.update_weights(random_weights(info.parameters, seed=5), version())
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_update_bytes" in e.value.details
        assert c.server_info().weight_version == info.weight_version
        assert tokens_and_logprobs(greedy(c)) == before


def test_oversized_message_is_refused(client, stub, info):
    p = info.parameters[0]
    big = b"\0" * (info.max_message_bytes + 1024)
    v = version()
    msgs = [begin(v, [p]), chunk(0, 0, big), COMMIT]
    v_before = client.server_info().weight_version
    before = tokens_and_logprobs(greedy(client))
    _expect(stub, msgs, grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert client.server_info().weight_version == v_before
    assert tokens_and_logprobs(greedy(client)) == before


def test_broken_stream_leaves_weights_untouched(client, server, new_weights):
    """A client that goes away mid-stream: the server keeps the old weights."""
    v_before = client.server_info().weight_version
    before = tokens_and_logprobs(greedy(client))
    channel = grpc.insecure_channel(server.target)
    stub = rollout_pb2_grpc.RolloutServiceStub(channel)
    stop = threading.Event()

    def stalled():
        msgs = full_stream(new_weights, version())
        for _ in range(5):
            yield next(msgs)
        stop.wait(30)

    future = stub.UpdateWeights.future(stalled(), timeout=60)
    time.sleep(0.5)
    future.cancel()
    stop.set()
    channel.close()
    time.sleep(0.5)
    assert client.server_info().weight_version == v_before
    assert tokens_and_logprobs(greedy(client)) == before
    # the next update goes through
    ack = client.update_weights(new_weights, version())
    assert client.server_info().weight_version == ack.weight_version


def _long_calls(client, n, results, max_tokens, stream=False):
    def run(i):
        prompt = [20 + i, 30, 40]
        if stream:
            deltas = list(
                client.generate_stream(
                    prompt_token_ids=prompt, max_tokens=max_tokens, ignore_eos=True, temperature=0
                )
            )
            toks = [t for d in deltas for t in d.token_ids]
            finish = [d.finish_reason for d in deltas if d.finish_reason][-1]
            results.append((toks, finish, {d.weight_version for d in deltas}))
        else:
            r = client.generate(
                prompt_token_ids=prompt, max_tokens=max_tokens, ignore_eos=True, temperature=0
            )
            c = r.completions[0]
            results.append((list(c.token_ids), c.finish_reason, {r.weight_version}))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads


def _wait_running(client, n):
    deadline = time.monotonic() + 20
    while client.server_info().engine_requests < n:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _update_in_background(client, weights):
    """Starts a full update in a thread; its ack lands in result["r"]."""
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(r=client.update_weights(weights, version()))
    )
    thread.start()
    return thread, result


def test_wait_mode_finishes_in_flight_on_old_version(client, info):
    old = client.server_info().weight_version
    in_flight, arrivals = [], []
    threads = _long_calls(client, 3, in_flight, max_tokens=400)
    threads += _long_calls(client, 1, in_flight, max_tokens=400, stream=True)
    _wait_running(client, 4)
    updater, ack = _update_in_background(client, random_weights(info.parameters, seed=11))
    time.sleep(0.3)  # the update is now draining: new calls wait at the gate
    threads += _long_calls(client, 2, arrivals, max_tokens=8)
    for t in [*threads, updater]:
        t.join(120)
    new = ack["r"].weight_version
    assert len(in_flight) == 4 and len(arrivals) == 2
    for toks, finish, versions in in_flight:
        assert len(toks) == 400 and finish == pb.FINISH_REASON_LENGTH and versions == {old}
    for toks, _, versions in arrivals:
        assert len(toks) == 8 and versions == {new}


def test_abort_mode_aborts_in_flight_with_partial_tokens(client, info):
    old = client.server_info().weight_version
    in_flight, arrivals = [], []
    threads = _long_calls(client, 2, in_flight, max_tokens=1800)
    threads += _long_calls(client, 1, in_flight, max_tokens=1800, stream=True)
    _wait_running(client, 3)
    time.sleep(0.2)  # let them produce some tokens
    ack = client.update_weights(
        random_weights(info.parameters, seed=12), version(), pause_mode=pb.PAUSE_MODE_ABORT
    )
    threads += _long_calls(client, 1, arrivals, max_tokens=8)
    for t in threads:
        t.join(120)
    assert len(in_flight) == 3
    for toks, finish, versions in in_flight:
        assert finish == pb.FINISH_REASON_ABORT
        assert 0 < len(toks) < 1800
        assert versions == {old}
    assert arrivals[0][2] == {ack.weight_version}


def test_concurrent_update_is_aborted_and_nothing_mixed(client, server, info):
    a = random_weights(info.parameters, seed=21)
    b = random_weights(info.parameters, seed=22)
    va, vb = version(), version()
    channel = grpc.insecure_channel(server.target)
    stub = rollout_pb2_grpc.RolloutServiceStub(channel)

    def slow(weights, v):
        msgs = full_stream(weights, v)
        yield next(msgs)
        time.sleep(1.0)  # hold the update open while the second one starts
        yield from msgs

    first = stub.UpdateWeights.future(slow(a, va), timeout=60)
    time.sleep(0.3)
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        stub.UpdateWeights(full_stream(b, vb), timeout=60)
    assert e.value.code() == grpc.StatusCode.ABORTED
    assert time.monotonic() - t0 < 0.7, "the loser is refused at once, not queued"
    assert first.result().weight_version == va
    channel.close()
    served = tokens_and_logprobs(greedy(client))
    assert client.server_info().weight_version == va
    # The served weights are exactly a's: b then a again gives the same output.
    client.update_weights(b, version())
    client.update_weights(a, version())
    assert tokens_and_logprobs(greedy(client)) == served


def test_engine_failure_degrades_until_a_full_update(server, client, info, fault_file):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    def health():
        with grpc.insecure_channel(server.target) as ch:
            return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest()).status

    head = [p for p in info.parameters if p.name == "lm_head.weight"]
    fault_file.touch()
    try:
        with pytest.raises(RolloutError) as e:
            client.update_weights(random_weights(head, seed=1), version())
    finally:
        fault_file.unlink()
    assert e.value.code == grpc.StatusCode.INTERNAL and "degraded" in e.value.details
    assert client.server_info().degraded
    assert health() == health_pb2.HealthCheckResponse.NOT_SERVING
    with pytest.raises(RolloutError) as e:
        greedy(client)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "degraded" in e.value.details
    with pytest.raises(RolloutError) as e:
        client.update_weights(random_weights(head, seed=2), version())
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "full update" in e.value.details

    full = random_weights(info.parameters, seed=31)
    ack = client.update_weights(full, version())
    assert not client.server_info().degraded
    assert health() == health_pb2.HealthCheckResponse.SERVING
    recovered = greedy(client)
    assert recovered.weight_version == ack.weight_version
    # the recovery loaded every tensor: b then the same weights again gives the same output
    client.update_weights(random_weights(info.parameters, seed=32), version())
    client.update_weights(full, version())
    assert tokens_and_logprobs(greedy(client)) == tokens_and_logprobs(recovered)


def test_update_during_another_updates_apply_is_aborted_at_once(client, info):
    """The first update is draining (WAIT, a long call in flight): a second
    one is refused at once instead of queueing behind it."""
    in_flight = []
    # Long enough that the first update drains for seconds: a second update
    # queued behind it would take that long, one refused at once does not.
    threads = _long_calls(client, 1, in_flight, max_tokens=1500)
    _wait_running(client, 1)
    updater, first = _update_in_background(client, random_weights(info.parameters, seed=51))
    second = random_weights(info.parameters, seed=52)
    time.sleep(0.5)  # the first update is now in its apply phase, draining
    assert updater.is_alive()
    t0 = time.monotonic()
    with pytest.raises(RolloutError) as e:
        client.update_weights(second, version())
    assert e.value.code == grpc.StatusCode.ABORTED
    assert time.monotonic() - t0 < 1.0 and updater.is_alive()
    for t in [*threads, updater]:
        t.join(120)
    assert client.server_info().weight_version == first["r"].weight_version
