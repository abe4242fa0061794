"""Keepalive: long silent calls survive client pings; dead clients are dropped.

A unary Generate writes nothing on its connection until the rollout ends.
Load balancers, meshes and grpc-go or grpc-js users ping such connections
every 10 to 60 s; gRPC's default server policy counted every ping after the
first as a strike and closed the connection after the second (GOAWAY
ENHANCE_YOUR_CALM, "too_many_pings"), failing the call: with 10 s pings a
Python client's call died after 40 to 50 s (UNAVAILABLE "Too many pings"), a
Node client's after 50 s (RESOURCE_EXHAUSTED "Bandwidth exhausted or memory
limit exceeded"). The server's policy (server.KEEPALIVE_OPTIONS) accepts them,
and pings its clients itself to drop those that stopped answering.

A call is made to last that long at no CPU cost by stopping the engine's
processes (SIGSTOP) while it waits: the server process answers pings, and no
byte of the call is written until they continue.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent import futures
from contextlib import contextmanager

import grpc
import psutil
import pytest
from google.protobuf import json_format

from rollout.v1 import rollout_pb2 as pb
from rollout.v1 import rollout_pb2_grpc
from rollout_client.calls.connection import MIN_KEEPALIVE_SECONDS, ConnectionOptions
from rollout_service.server import KEEPALIVE_OPTIONS
from tests.support import idle_ahead
from tests.support.node import PACKAGE, packed_once

PING_MS = 10_000
# The calls are held this long, and must outlive the 40 to 50 s gRPC's
# default policy let them live (the Node client's clock starts a little later).
MIN_CALL_SECONDS = 60.0
OUTLIVED_SECONDS = 55.0
# The server pings every 30 s and waits 20 s for the answer.
DEAD_CLIENT_DROPPED_WITHIN = 75.0

# ignore_eos: a sampled end-of-sequence would end a call early (seen once: 3 tokens).
REQUEST_JSON = {
    "prompt_token_ids": [1, 2, 3],
    "sampling_params": {"max_tokens": 4, "ignore_eos": True},
}
REQUEST = json_format.ParseDict(REQUEST_JSON, pb.GenerateRequest())

# The Node client (client/node), as packed and installed (conftest's `packed`),
# pinging every 10 s through its channelOptions, with no retry: a retried
# call would hide the failure.
NODE_CALL = f"""
const {{ RolloutClient }} = require({PACKAGE!r});
const cfg = JSON.parse(process.argv[2]);
const client = new RolloutClient(cfg.target, {{
  retries: 0, timeoutMs: 300000,
  channelOptions: {{ "grpc.keepalive_time_ms": {PING_MS}, "grpc.keepalive_timeout_ms": 10000 }},
}});
const t0 = Date.now();
const done = (out) => {{
  console.log(JSON.stringify({{ ...out, seconds: (Date.now() - t0) / 1000 }}));
  client.close();
}};
client.generate(cfg.request)
  .then((r) => done({{ tokens: r.completions[0].token_ids.length }}))
  .catch((e) => done({{ error: e.codeName ?? String(e), details: e.details }}));
"""

# A client that sends a Generate and then stops answering: its process is
# stopped, as a host that vanished without closing its sockets.
DEAD_CLIENT = f"""
import sys, time, grpc
from rollout.v1 import rollout_pb2 as pb, rollout_pb2_grpc
channel = grpc.insecure_channel(sys.argv[1])
grpc.channel_ready_future(channel).result(timeout=60)
request = pb.GenerateRequest.FromString(bytes.fromhex({REQUEST.SerializeToString().hex()!r}))
call = rollout_pb2_grpc.RolloutServiceStub(channel).Generate.future(request, timeout=600)
time.sleep(1)  # on the wire
print("sent", flush=True)
time.sleep(600)
"""


@contextmanager
def engine_stopped(server):
    """The engine's processes (engine core, workers) stopped, then continued."""
    procs = psutil.Process(server.proc.pid).children(recursive=True)
    for p in procs:
        p.suspend()
    try:
        yield
    finally:
        for p in procs:
            p.resume()


def _python_call(target: str) -> futures.Future:
    """A plain grpc client pinging every 10 s, without retries."""
    options = [
        ("grpc.keepalive_time_ms", PING_MS),
        ("grpc.keepalive_timeout_ms", 10_000),
        # gRPC Core clients stop pinging after 2 pings with no data between.
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.enable_retries", 0),
    ]
    channel = grpc.insecure_channel(target, options=options)
    t0 = time.monotonic()
    call = rollout_pb2_grpc.RolloutServiceStub(channel).Generate.future(REQUEST, timeout=300)
    outcome: futures.Future = futures.Future()

    def done(f):
        try:
            out = {"tokens": len(f.result().completions[0].token_ids)}
        except grpc.RpcError as e:
            out = {"error": e.code().name, "details": e.details()}
        outcome.set_result({**out, "seconds": time.monotonic() - t0})
        channel.close()

    call.add_done_callback(done)
    return outcome


def _connection_to(proc: psutil.Process, port: int):
    (conn,) = [c for c in proc.net_connections("tcp") if c.raddr and c.raddr.port == port]
    return conn


def _wait_until_hung_up(proc: psutil.Process, port: int, timeout: float) -> float | None:
    """Seconds until the server closed `proc`'s connection (its socket then
    sits in CLOSE_WAIT, the process being stopped), or None."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if _connection_to(proc, port).status == psutil.CONN_CLOSE_WAIT:
            return time.monotonic() - t0
        time.sleep(0.5)
    return None


def _long_calls(server) -> dict:
    """The scenario: with the engine stopped for a minute, a dead client's
    call, a Python and a Node call pinging every 10 s; what each call got,
    and when the server hung up on the dead client."""
    packed = packed_once()
    script = packed.app / "long_call.js"
    script.write_text(NODE_CALL)
    dead = subprocess.Popen(
        [sys.executable, "-c", DEAD_CLIENT, server.target], stdout=subprocess.PIPE, text=True
    )
    node = None
    try:
        with engine_stopped(server):
            assert dead.stdout.readline().strip() == "sent"
            dead_proc = psutil.Process(dead.pid)
            dead_proc.suspend()
            t0 = time.monotonic()
            python = _python_call(server.target)
            cfg = json.dumps({"target": server.target, "request": REQUEST_JSON})
            node = subprocess.Popen(
                ["node", str(script), cfg],
                cwd=packed.app,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            hung_up = _wait_until_hung_up(dead_proc, server.port, DEAD_CLIENT_DROPPED_WITHIN)
            time.sleep(max(0.0, MIN_CALL_SECONDS - (time.monotonic() - t0)))
        node_out, node_err = node.communicate(timeout=120)
        calls = {
            "python": python.result(timeout=120),
            "node": json.loads(node_out.strip().splitlines()[-1]) if node_out else node_err,
        }
    finally:
        dead.kill()
        dead.wait()
        if node is not None and node.poll() is None:
            node.kill()
    return {"calls": calls, "dead client hung up": hung_up}


# A minute with the engine stopped and only clients waiting: it runs on the
# delta reference server (a shared server the first tests do not use) while
# the engine-free tests run, before any test uses that server
# (tests/support/idle_ahead.py); this test reads what it saw.
@idle_ahead.runs_ahead("delta_reference", _long_calls)
def test_long_calls_survive_10s_pings_and_a_dead_client_is_dropped(delta_reference):
    seen = idle_ahead.outcome(test_long_calls_survive_10s_pings_and_a_dead_client_is_dropped)
    calls_ok = all(
        isinstance(out, dict) and out.get("tokens") == 4 and out["seconds"] > OUTLIVED_SECONDS
        for out in seen["calls"].values()
    )
    # Both calls answered after outliving the default policy, and the server
    # hung up on the client whose pings went unanswered.
    assert calls_ok and seen["dead client hung up"] is not None, seen


def test_the_python_client_pings_during_calls_within_the_servers_policy():
    floor_ms = dict(KEEPALIVE_OPTIONS)["grpc.http2.min_ping_interval_without_data_ms"]
    options = dict(ConnectionOptions().channel_options())
    # Every 30 s while a call is open, all through a silent one.
    assert options["grpc.keepalive_time_ms"] == 30_000
    # grpcio closes a connection on the ping timeout (default 60 s).
    assert options["grpc.http2.ping_timeout_ms"] == 20_000
    assert options["grpc.http2.max_pings_without_data"] == 0
    assert options["grpc.keepalive_permit_without_calls"] == 0
    # Nothing pings more often than every twice the server's floor (timer jitter).
    assert MIN_KEEPALIVE_SECONDS * 1000 >= 2 * floor_ms
    with pytest.raises(ValueError, match="keepalive_seconds"):
        ConnectionOptions(keepalive_seconds=MIN_KEEPALIVE_SECONDS - 0.1)
    off = dict(ConnectionOptions(keepalive_seconds=None).channel_options())
    assert "grpc.keepalive_time_ms" not in off
