"""The error policy alone (no engine): vLLM's exceptions are built directly,
or raised by vLLM's own SamplingParams checks, so that a vLLM upgrade that
changes them shows up here."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest
from google.rpc import error_details_pb2
from vllm import SamplingParams
from vllm.exceptions import (
    LoRAAdapterNotFoundError,
    MaxQueuedTokensError,
    QueueOverflowError,
    VLLMUnprocessableEntityError,
    VLLMValidationError,
)
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from rollout.v1 import rollout_pb2 as pb
from rollout_service.rpc.handlers import Ending, streaming, unary
from rollout_service.rpc.statuses import abort, grpc_code
from rollout_service.status.errors import (
    Aborted,
    Code,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    from_exception,
)
from tests.support.aborts import Context, aborted

INV = grpc.StatusCode.INVALID_ARGUMENT
PROMPT = "prompt_token_ids/prompt_text/messages"


def raised_by(**kw) -> Exception:
    with pytest.raises(Exception) as e:  # noqa: PT011 (vLLM raises several types; callers assert on them)
        SamplingParams(**kw)
    return e.value


def wrapped(cause: Exception) -> EngineGenerateError:
    """As AsyncLLM.generate raises it: `raise EngineGenerateError() from e`."""
    e = EngineGenerateError()
    e.__cause__ = cause
    return e


@pytest.mark.parametrize(
    ("error", "field", "message"),
    [
        # SamplingParams checks that set no parameter: named by their message.
        (raised_by(n=1_000_000), "sampling_params.n", "n must be at most 16384, got 1000000."),
        (raised_by(n=64, temperature=0), "sampling_params.n", "n must be 1 when using greedy"),
        (raised_by(presence_penalty=3), "sampling_params.presence_penalty", "presence_penalty"),
        (raised_by(stop=[""]), "sampling_params.stop", "stop cannot contain an empty string."),
        # A parameter vLLM names itself.
        (raised_by(temperature=-1), "sampling_params.temperature", "temperature must be non-"),
        # The prompt checks of vLLM's renderer and input processor.
        (
            VLLMValidationError(
                "This model's maximum context length is 2048 tokens. However, your prompt "
                "contains 2058 input tokens, which exceeds this limit even without any "
                "output tokens. Please reduce the length of the input prompt.",
                parameter="input_tokens",
                value=2058,
            ),
            PROMPT,
            "This model's maximum context length is 2048 tokens.",
        ),
        (
            VLLMValidationError(
                "The decoder prompt (length 2048) plus the number of requested output tokens "
                "(at least 1) is longer than the maximum model length of 2048."
            ),
            PROMPT,
            "The decoder prompt (length 2048)",
        ),
        (VLLMValidationError("The decoder prompt cannot be empty"), PROMPT, "The decoder"),
        (VLLMValidationError("Token id 600 is out of vocabulary"), PROMPT, "Token id 600"),
        # Not a field of ours: the request, with vLLM's parameter in the message.
        (
            VLLMValidationError("too many ids", parameter="logprob_token_ids", value=200),
            "request",
            "too many ids (parameter=logprob_token_ids, value=200)",
        ),
        (
            VLLMUnprocessableEntityError("cannot fetch the image", parameter="image_url"),
            "request",
            "cannot fetch the image (parameter=image_url)",
        ),
        (LoRAAdapterNotFoundError("a", "/b"), "request", "Loading lora a failed"),
        # Unmigrated ValueErrors, raised directly or under AsyncLLM.generate's wrapper.
        (ValueError("bad thing"), "request", "bad thing"),
        (
            wrapped(ValueError("Multi-modal processor not available for text-only models")),
            "request",
            "Multi-modal processor not available for text-only models",
        ),
    ],
)
def test_client_errors_are_invalid_argument_naming_the_field(error, field, message):
    err = from_exception(error)
    assert isinstance(err, InvalidArgument)
    assert err.code == Code.INVALID_ARGUMENT
    assert err.field == field
    assert err.message.startswith(f"{field}: {message}"), err.message


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (EngineDeadError(), Code.UNAVAILABLE),
        (QueueOverflowError(), Code.RESOURCE_EXHAUSTED),
        (MaxQueuedTokensError(), Code.RESOURCE_EXHAUSTED),
    ],
)
def test_engine_state_errors(error, code):
    assert from_exception(error).code == code


@pytest.mark.parametrize(
    "error",
    [RuntimeError("boom"), EngineGenerateError(), wrapped(RuntimeError("boom")), TypeError("x")],
)
def test_the_unexpected_maps_to_nothing(error):
    assert from_exception(error) is None  # abort makes it INTERNAL


def test_abort_sends_a_field_violation_for_vllm_errors():
    code, details, status = aborted(raised_by(n=64, temperature=0))
    assert code == INV
    assert details == "sampling_params.n: n must be 1 when using greedy sampling, got 64."
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    assert bad.field_violations[0].field == "sampling_params.n"


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (FailedPrecondition("degraded"), "DEGRADED"),
        (
            FailedPrecondition("served", reason=pb.ERROR_REASON_VERSION_ALREADY_SERVED),
            "VERSION_ALREADY_SERVED",
        ),
        (Aborted("lost"), "UPDATE_IN_PROGRESS"),
        (ResourceExhausted("full", reason=pb.ERROR_REASON_QUEUE_FULL), "QUEUE_FULL"),
        (ResourceExhausted("big"), "LIMIT_EXCEEDED"),
    ],
)
def test_our_errors_keep_their_status_and_reason(error, reason):
    code, details, status = aborted(error)
    assert (code, details) == (grpc_code(error.code), error.message)
    assert code.name == error.code.name  # the same status, named alike on both sides
    info = error_details_pb2.ErrorInfo()
    assert status.details[-1].Unpack(info)
    assert (info.reason, info.domain) == (reason, "rollout.v1")
    assert pb.ErrorReason.Value("ERROR_REASON_" + reason)  # a documented reason


def test_bad_input_carries_the_field_and_the_reason():
    _, _, status = aborted(InvalidArgument("sampling_params.top_p", "too big"))
    bad, info = error_details_pb2.BadRequest(), error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(bad) and status.details[1].Unpack(info)
    assert bad.field_violations[0].field == "sampling_params.top_p"
    assert info.reason == "INVALID_FIELD"


def test_the_engine_s_queue_overflow_is_queue_full():
    _, _, status = aborted(QueueOverflowError())
    info = error_details_pb2.ErrorInfo()
    assert status.details[-1].Unpack(info) and info.reason == "QUEUE_FULL"


def test_the_unexpected_is_logged_and_internal(caplog):
    with caplog.at_level(logging.INFO, logger="rollout_service.status.errors"):
        code, details, _ = aborted(RuntimeError("boom"), rpc="ResetCaches")
    assert code == grpc.StatusCode.INTERNAL
    assert details == "ResetCaches failed: RuntimeError: boom"
    (record,) = caplog.records
    assert record.levelno == logging.ERROR and record.exc_info[1].args == ("boom",)


def test_abort_error_passes_untouched():
    context = Context()
    error = grpc.aio.AbortError()
    with pytest.raises(grpc.aio.AbortError) as e:
        asyncio.run(abort(context, error, "Generate"))
    assert e.value is error and context.aborted is None


class Service:
    def __init__(self) -> None:
        self.ending = Ending()

    @unary
    async def Unary(self, request, context):
        raise request

    @streaming
    async def Stream(self, request, context):
        yield 1
        raise request

    @unary
    async def Waits(self, request, context):
        await asyncio.sleep(60)  # on an engine that died before it answered

    @streaming
    async def StreamWaits(self, request, context):
        yield 1
        await asyncio.sleep(60)


async def drain(stream) -> list:
    return [item async for item in stream]


@pytest.mark.parametrize("kind", ["unary", "streaming"])
def test_decorators_apply_the_policy_and_let_cancellation_pass(kind):
    call = Service().Unary if kind == "unary" else lambda r, c: drain(Service().Stream(r, c))
    context = Context()
    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(call(raised_by(n=1_000_000), context))
    assert context.aborted[0] == INV and context.aborted[1].startswith("sampling_params.n: ")
    context = Context()
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(call(asyncio.CancelledError(), context))
    assert context.aborted is None


@pytest.mark.parametrize("kind", ["unary", "streaming"])
def test_calls_running_when_the_engine_dies_end_unavailable_and_a_cancelled_one_stays_so(kind):
    """The server ends its running calls when the engine dies (server.py):
    UNAVAILABLE, which clients retry elsewhere, not the CANCELLED gRPC
    would send at the end of the shutdown grace. A call whose own client went
    away stays cancelled, a stop under way or not."""
    from rollout_service.status.errors import Unavailable

    async def main(end: bool, context: Context, stopping: bool = False) -> None:
        service = Service()
        waits = service.Waits if kind == "unary" else service.StreamWaits
        call = asyncio.ensure_future(
            waits(None, context) if kind == "unary" else drain(waits(None, context))
        )
        await asyncio.sleep(0.05)
        assert len(service.ending.tasks) == 1
        if stopping:  # a stop under way, its calls draining
            service.ending.refuse(lambda: Unavailable("the server is shutting down"))
        if end:
            service.ending.end_all(lambda: Unavailable("the engine has died"))
        else:
            call.cancel()  # its client went away
        try:
            await call
        finally:
            assert not service.ending.tasks and not service.ending.cut

    ended = Context()
    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(main(True, ended))
    assert ended.aborted[0] == grpc.StatusCode.UNAVAILABLE
    assert ended.aborted[1] == "the engine has died"
    for stopping in (False, True):
        cancelled = Context()
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(main(False, cancelled, stopping))
        assert cancelled.aborted is None, stopping
