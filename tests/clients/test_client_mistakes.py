"""The Python client's answers to a newcomer's mistakes: a wrong port, a
misspelled tensor name, Ctrl-C during a push. Each test checks what the user
reads. Most run against a stand-in server in this process (grpc's own health
servicer, a RolloutService that answers GetServerInfo and UpdateWeights);
one runs against the real one."""

from __future__ import annotations

import _thread
import asyncio
import contextlib
import signal
import subprocess
import threading
import time
from concurrent import futures

import grpc
import numpy as np
import pytest
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import save_file as save_torch

from harness.serverproc import free_port
from harness.weights_util import version
from rollout.v1 import rollout_pb2_grpc
from rollout_client import (
    AsyncRolloutClient,
    RolloutClient,
    RolloutError,
    ServerNotReady,
    UpdateInterrupted,
    pb,
)
from tests.support.cli import CLI, run

WAIT = 60  # seconds: only ever reached when a test is failing


class StandIn(rollout_pb2_grpc.RolloutServiceServicer):
    """GetServerInfo with a manifest of float32 tensors; UpdateWeights that
    records what arrives and, once the commit is in, holds its answer until
    the client goes away (the interrupt comes meanwhile)."""

    def __init__(self, parameters: dict[str, list[int]]) -> None:
        self.parameters = [
            pb.TensorSpec(name=n, dtype=pb.D_TYPE_FLOAT32, shape=s) for n, s in parameters.items()
        ]
        self.received: list[str] = []
        self.begun = threading.Event()
        self.committed = threading.Event()
        self.ended = threading.Event()

    def GetServerInfo(self, request, context):
        return pb.GetServerInfoResponse(weight_version="initial", parameters=self.parameters)

    def UpdateWeights(self, request_iterator, context):
        gone = threading.Event()
        context.add_callback(gone.set)
        try:
            for m in request_iterator:
                self.received.append(m.WhichOneof("kind"))
                self.begun.set()
                if m.HasField("commit"):
                    self.committed.set()
                    gone.wait(WAIT)
                    return pb.UpdateWeightsResponse()
        except grpc.RpcError:
            pass  # the client cancelled
        finally:
            self.ended.set()
        return pb.UpdateWeightsResponse()


@contextlib.contextmanager
def serving(servicer=None, status=health_pb2.HealthCheckResponse.SERVING):
    """A gRPC server on a free port with grpc's health servicer at `status`
    (and `servicer`, if given); yields (target, health servicer)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    checks = health.HealthServicer()
    checks.set("", status)
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    if servicer is not None:
        rollout_pb2_grpc.add_RolloutServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", checks
    finally:
        server.stop(None)


def wait_sync(target, **kwargs):
    with RolloutClient(target) as c:
        c.wait_until_ready(**kwargs)


def wait_async(target, **kwargs):
    async def main():
        async with AsyncRolloutClient(target) as c:
            await c.wait_until_ready(**kwargs)

    asyncio.run(main())


@pytest.mark.parametrize("wait", [wait_sync, wait_async], ids=["sync", "async"])
def test_a_wrong_port_answers_connection_refused_before_the_timeout(wait):
    timeout = 60
    t0 = time.monotonic()
    with pytest.raises(ServerNotReady) as e:
        wait(f"127.0.0.1:{free_port()}", timeout=timeout, connect_grace=1)
    assert time.monotonic() - t0 < timeout, "waited out the whole timeout"
    assert isinstance(e.value, TimeoutError)  # what callers caught before
    assert "Connection refused" in str(e.value)
    assert "connect_grace" in str(e.value)
    assert e.value.last_error.code == grpc.StatusCode.UNAVAILABLE


def test_a_warming_server_is_waited_for_past_the_grace():
    """NOT_SERVING is an engine starting (minutes): never given up on early;
    the wait ends when it turns SERVING."""
    with serving(status=health_pb2.HealthCheckResponse.NOT_SERVING) as (target, checks):
        grace = 0.2
        timer = threading.Timer(grace * 5, checks.set, ("", health_pb2.HealthCheckResponse.SERVING))
        timer.start()
        try:
            wait_sync(target, timeout=WAIT, connect_grace=grace)
        finally:
            timer.cancel()


@pytest.mark.parametrize("wait", [wait_sync, wait_async], ids=["sync", "async"])
def test_a_server_that_stays_not_serving_is_named_at_the_timeout(wait):
    with serving(status=health_pb2.HealthCheckResponse.NOT_SERVING) as (target, _):
        with pytest.raises(TimeoutError) as e:
            wait(target, timeout=1, connect_grace=0.1)
    assert "answers NOT_SERVING" in str(e.value) and "warming up" in str(e.value)
    assert e.value.last_error is None


def test_a_misspelled_tensor_name_suggests_the_served_one():
    names = {"model.norm.weight": [4], "lm_head.weight": [8, 4]}
    with serving(StandIn(names)) as (target, _), RolloutClient(target) as c:
        with pytest.raises(RolloutError) as e:
            c.update_weights({"model.norm.weigth": np.zeros(4, np.float32)}, "v1")
        with pytest.raises(ValueError, match="server_info"):  # nothing close: where to look
            c.update_weights({"encoder.conv.bias": np.zeros(4, np.float32)}, "v1")
    assert isinstance(e.value, ValueError)  # `except ValueError` still catches it
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and e.value.reason == "INVALID_FIELD"
    assert "did you mean model.norm.weight?" in str(e.value)


def test_a_misspelled_tensor_name_in_the_cli_against_the_real_server(server, tmp_path):
    f = tmp_path / "norm.safetensors"
    save_torch({"model.norm.weigth": torch.zeros(128, dtype=torch.bfloat16)}, f)
    p = run(server, "push-weights", str(f), "--version", version(), check=False)
    assert p.returncode == 1
    assert "model.norm.weigth: not a parameter" in p.stderr
    assert "did you mean model.norm.weight" in p.stderr


class Gate:
    """A float32 tensor whose bytes are not ready until the gate opens: a
    push reading it waits there, before its commit."""

    dtype = np.dtype(np.float32)
    shape = (4,)

    def __init__(self) -> None:
        self.reading = threading.Event()
        self.open = threading.Event()

    def __array__(self, dtype=None, copy=None):
        self.reading.set()
        self.open.wait(WAIT)
        return np.zeros(self.shape, self.dtype)


def interrupted_push(c: RolloutClient, source, *when: threading.Event) -> BaseException | None:
    """update_weights(source), with Ctrl-C (in this, the main thread) once
    every `when` is set; what it raised (anything: a bare KeyboardInterrupt
    must fail the test, not end the session)."""

    def interrupt():
        if all(w.wait(WAIT) for w in when):
            _thread.interrupt_main()

    threading.Thread(target=interrupt).start()
    try:
        c.update_weights(source, "v1")
    except BaseException as e:
        return e
    return None


def test_ctrl_c_before_the_commit_says_not_applied_and_sends_no_commit():
    stand_in, gate = StandIn({"w": [4]}), Gate()
    with serving(stand_in) as (target, _), RolloutClient(target) as c:
        try:
            raised = interrupted_push(c, {"w": gate}, stand_in.begun, gate.reading)
        finally:
            gate.open.set()  # the push may read on: it must send nothing more
        assert stand_in.ended.wait(WAIT)
    assert isinstance(raised, UpdateInterrupted), repr(raised)
    assert "before its commit was sent: not applied" in str(raised)
    assert not raised.commit_sent
    assert stand_in.received == ["begin"]


def test_ctrl_c_after_the_commit_says_how_to_check():
    stand_in = StandIn({"w": [4]})
    with serving(stand_in) as (target, _), RolloutClient(target) as c:
        raised = interrupted_push(c, {"w": np.ones(4, np.float32)}, stand_in.committed)
    assert isinstance(raised, UpdateInterrupted), repr(raised)
    assert isinstance(raised, KeyboardInterrupt)  # Ctrl-C still ends a program
    text = str(raised)
    assert "may have been applied" in text and "server_info().weight_version" in text
    assert "replayed=True" in text


def test_a_cancelled_async_push_stops_before_its_commit_and_says_so():
    stand_in, gate = StandIn({"w": [4]}), Gate()

    async def main(target):
        async with AsyncRolloutClient(target) as c:
            push = asyncio.create_task(c.update_weights({"w": gate}, "v1"))
            for event in (stand_in.begun, gate.reading):
                await asyncio.to_thread(event.wait, WAIT)
            push.cancel()
            with pytest.raises(asyncio.CancelledError) as e:
                await push
            gate.open.set()  # the push may read on: it must send nothing more
            await asyncio.to_thread(stand_in.ended.wait, WAIT)
            return e.value

    with serving(stand_in) as (target, _):
        try:
            cancelled = asyncio.run(main(target))
        finally:
            gate.open.set()
    assert type(cancelled) is asyncio.CancelledError  # asyncio.timeout() needs the exact type
    assert any("not applied" in n for n in getattr(cancelled, "__notes__", [])), cancelled
    assert stand_in.received == ["begin"]


def test_a_cancelled_async_push_after_its_commit_says_it_may_have_applied():
    stand_in = StandIn({"w": [4]})

    async def main(target):
        async with AsyncRolloutClient(target) as c:
            push = asyncio.create_task(c.update_weights({"w": np.ones(4, np.float32)}, "v1"))
            await asyncio.to_thread(stand_in.committed.wait, WAIT)
            push.cancel()
            with pytest.raises(asyncio.CancelledError) as e:
                await push
            return e.value

    with serving(stand_in) as (target, _):
        cancelled = asyncio.run(main(target))
    notes = getattr(cancelled, "__notes__", [])
    assert any("may have been applied" in n and "replayed=True" in n for n in notes), notes


def test_ctrl_c_during_push_weights_prints_what_happened_and_exits_130(tmp_path):
    f = tmp_path / "w.safetensors"
    save_numpy({"w": np.ones(4, np.float32)}, f)
    stand_in = StandIn({"w": [4]})
    with serving(stand_in) as (target, _):
        cmd = [CLI, "--target", target, "push-weights", str(f), "--version", "v1"]
        with subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True) as p:
            try:
                assert stand_in.committed.wait(WAIT), "the push never committed"
                p.send_signal(signal.SIGINT)
                _, err = p.communicate(timeout=WAIT)
            finally:
                if p.poll() is None:
                    p.kill()
    assert p.returncode == 130, err
    assert "Traceback" not in err, err
    assert "may have been applied" in err and "rollout-client info" in err
