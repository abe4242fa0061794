"""The gRPC handlers' one way to the App (rpc/readiness.py), engine-free:
every RPC answers STARTING before the engine is up, SHUTTING_DOWN once a
signal stops the server and ENGINE_DEAD once the engine died, with the
statuses and messages the wire has always carried, and every RPC of the
proto is served by exactly one handler method (rpc/servicer.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from rollout.v1 import rollout_pb2 as pb
from rollout_service.config import ServerConfig
from rollout_service.rpc.readiness import Serving
from rollout_service.rpc.servicer import SERVICE, rpc_methods
from rollout_service.status.errors import Unavailable, engine_dead, shutting_down
from tests.support.aborts import Context

STARTING = ("the engine is starting; wait for health SERVING", "STARTING")
DEAD = ("the engine has died; the server is shutting down", "ENGINE_DEAD")
SHUTTING = (
    "the server is shutting down; retry on another replica or once it has restarted",
    "SHUTTING_DOWN",
)


class StandInEngine:
    errored = False


def started() -> tuple[Serving, StandInEngine]:
    """A Serving started on a stand-in App: what the readiness check reads
    (the engine's `errored`) and what the pipeline's constructors read."""
    engine = StandInEngine()
    app = SimpleNamespace(
        engine=engine, info=SimpleNamespace(limits=SimpleNamespace(max_model_len=64))
    )
    serving = Serving(ServerConfig())
    serving.start(app)  # type: ignore[arg-type]  # a stand-in, engine-free
    return serving, engine


def answer(method, request=None) -> tuple[grpc.StatusCode, str, str]:
    """What the call's client sees: status, message and ErrorInfo reason."""
    context = Context()

    async def call():
        result = method(request, context)
        if hasattr(result, "__aiter__"):  # a response stream: its errors come as it is read
            async for _ in result:
                pass
        else:
            await result

    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(call())
    code, details, trailers = context.aborted
    status = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    info = error_details_pb2.ErrorInfo()
    assert status.details[-1].Unpack(info)
    return code, details, info.reason


def test_every_rpc_has_exactly_one_handler_method():
    methods = rpc_methods(Serving(ServerConfig()))
    assert sorted(methods) == sorted(m.name for m in SERVICE.methods)
    for name, method in methods.items():
        assert method.__name__ == name


def test_every_rpc_answers_starting_before_the_engine_is_up():
    serving = Serving(ServerConfig())
    with pytest.raises(Unavailable) as e:
        serving.ready  # noqa: B018 (the property is the check)
    assert (e.value.message, e.value.reason) == (STARTING[0], pb.ERROR_REASON_STARTING)
    for name, method in rpc_methods(serving).items():
        code, details, reason = answer(method)
        assert (code, details, reason) == (grpc.StatusCode.UNAVAILABLE, *STARTING), name


def test_a_started_serving_holds_the_app_and_the_pipeline_over_it():
    serving, engine = started()
    ready = serving.ready
    assert ready.app.engine is engine
    assert ready.generations.app is ready.app
    assert ready.turns.generations is ready.generations
    # Abort finds every front's calls in the one registry the holder made.
    assert ready.generations.calls is serving.calls


def test_every_rpc_answers_engine_dead_once_the_engine_died():
    serving, engine = started()
    engine.errored = True
    for name, method in rpc_methods(serving).items():
        code, details, reason = answer(method)
        assert (code, details, reason) == (grpc.StatusCode.UNAVAILABLE, *DEAD), name


@pytest.mark.parametrize(
    ("refusal", "expected"),
    [(engine_dead, DEAD), (shutting_down, SHUTTING)],
    ids=["engine died", "signal"],
)
def test_a_call_arriving_while_the_server_stops_answers_why(refusal, expected):
    """server.py refuses new calls once it stops: the watchdog saw the engine
    die (before vLLM's `errored` says so), or a signal came and the calls in
    flight drain."""
    serving, _ = started()
    serving.ending.refuse(refusal)
    for name, method in rpc_methods(serving).items():
        code, details, reason = answer(method)
        assert (code, details, reason) == (grpc.StatusCode.UNAVAILABLE, *expected), name
