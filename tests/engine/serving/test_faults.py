"""Faults done for real: clients killed mid-call, hundreds of cancellations,
the engine process dying."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.weights_util import random_weights, version
from tests.support.callers import calling_until_exit

PROMPT = [11, 22, 33, 44, 55]


def fingerprint(client):
    r = client.generate(prompt_token_ids=PROMPT, max_tokens=8, temperature=0)
    return r.weight_version, list(r.completions[0].token_ids), list(r.completions[0].logprobs)


def segments(pid: int) -> list[str]:
    """The staging segments server `pid` maps (names are random, so they are
    found through the process). One replaced but still mapped shows as
    "... (deleted)": a leak."""
    with open(f"/proc/{pid}/maps") as f:
        return sorted(
            {line.split(maxsplit=5)[5].strip() for line in f if "/rollout-staging-" in line}
        )


def test_client_killed_mid_update_changes_nothing(server, client, info):
    before = fingerprint(client)
    staging_before = segments(server.proc.pid)
    script = textwrap.dedent(
        f"""
        import sys, time, grpc
        from rollout.v1 import rollout_pb2_grpc
        from rollout_client import RolloutClient
        from harness.weights_util import full_stream, random_weights
        info = RolloutClient({server.target!r}).server_info()
        msgs = full_stream(random_weights(info.parameters, seed=77), "killed")
        def stalled():
            for i, m in enumerate(msgs):
                yield m
                if i == 5:
                    print("streaming", flush=True)
                    time.sleep(600)
        stub = rollout_pb2_grpc.RolloutServiceStub(grpc.insecure_channel({server.target!r}))
        stub.UpdateWeights(stalled())
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "streaming"
    child.send_signal(signal.SIGKILL)
    child.wait()
    time.sleep(1.0)
    assert fingerprint(client) == before
    assert segments(server.proc.pid) == staging_before  # the region is kept for reuse, not leaked
    ack = client.update_weights(random_weights(info.parameters, seed=78), version())
    assert client.server_info().weight_version == ack.weight_version


def test_hundreds_of_cancelled_streams_leak_nothing(server, client):
    baseline = segments(server.proc.pid)
    rss_before = psutil.Process(server.proc.pid).memory_info().rss
    for _ in range(200):
        stream = client.generate_stream(prompt_token_ids=PROMPT, max_tokens=1000, ignore_eos=True)
        next(stream)
        stream.close()
    deadline = time.monotonic() + 15
    while client.server_info().engine_requests:
        assert time.monotonic() < deadline, "engine requests leaked"
        time.sleep(0.05)
    assert segments(server.proc.pid) == baseline
    growth = psutil.Process(server.proc.pid).memory_info().rss - rss_before
    assert growth < 200 << 20, f"server RSS grew by {growth >> 20} MiB"
    assert fingerprint(client)[1]


# Callers that keep calling while the engine dies and the server exits, every
# 10 ms: a call may land at any moment of it, the last milliseconds included.
CALLERS = 4


def test_engine_death_is_reported_and_the_server_exits_nonzero(own_server):
    """Every call a dying server does not answer fails UNAVAILABLE (a
    client's retry policy moves on), never CANCELLED: a graceful gRPC stop
    cancelled the calls that crossed its GOAWAY."""
    proc = own_server
    try:
        engine_cores = [
            p
            for p in psutil.Process(proc.proc.pid).children(recursive=True)
            if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline())
        ]
        assert engine_cores, "vLLM runs its engine core in a child process"
        with calling_until_exit(proc, CALLERS, every=0.01, max_tokens=4, within=30) as codes:
            for p in engine_cores:
                p.kill()
            assert proc.proc.wait(60) == 1
        assert codes and set(codes) == {grpc.StatusCode.UNAVAILABLE}, Counter(c.name for c in codes)
        with grpc.insecure_channel(proc.target) as ch, pytest.raises(grpc.RpcError):
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
    finally:
        proc.stop()
