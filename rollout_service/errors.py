"""One error policy for every RPC.

Handlers only raise; `abort` turns what they raise into the call's status:

    raised                                   status
    RpcError subclasses (ours)               their own code
    vLLM's VLLMClientError (VLLMValidation-  INVALID_ARGUMENT naming the field
      Error, ...; not a ValueError)            ("sampling_params.n: ...")
    ValueError (vLLM's unmigrated checks)    INVALID_ARGUMENT, likewise
    EngineGenerateError caused by a          INVALID_ARGUMENT, likewise (vLLM
      ValueError                               wraps input-processing errors)
    vLLM's QueueOverflowError,               RESOURCE_EXHAUSTED, as our own
      MaxQueuedTokensError                     --max-queued-generate
    EngineDeadError                          UNAVAILABLE
    anything else                            INTERNAL, logged with its traceback
    grpc.aio.AbortError                      re-raised: the call has ended
    asyncio.CancelledError                   passes (it is a BaseException)

Log lines carry the call's request id through `logs.request_id`.
"""

from __future__ import annotations

import logging
import re

import grpc

from rollout.v1 import rollout_pb2 as pb

log = logging.getLogger(__name__)


class RpcError(Exception):
    """An error that maps to one gRPC status code."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidArgument(RpcError):
    """The request is malformed; the message names the field."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class FailedPrecondition(RpcError):
    """The request conflicts with the server's state (version, degraded, ...)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(RpcError):
    """The request lost a race with another one (e.g. a concurrent update)."""

    code = grpc.StatusCode.ABORTED


class ResourceExhausted(RpcError):
    """The request goes over a configured limit; the message names it."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(RpcError):
    """Work that waited too long on the caller (a stalled update)."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unavailable(RpcError):
    """The server cannot serve right now (shutting down, engine dead)."""

    code = grpc.StatusCode.UNAVAILABLE


def status_details(err: RpcError) -> bytes:
    """The error as a serialized google.rpc.Status with rich details, for the
    `grpc-status-details-bin` trailer: a BadRequest field violation for bad
    input, an ErrorInfo with the error class as reason otherwise. Clients in
    any language read these with their gRPC status-details helpers."""
    from google.protobuf import any_pb2
    from google.rpc import error_details_pb2, status_pb2

    detail = any_pb2.Any()
    if isinstance(err, InvalidArgument):
        detail.Pack(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=err.field, description=err.message
                    )
                ]
            )
        )
    else:
        detail.Pack(
            error_details_pb2.ErrorInfo(reason=type(err).__name__.upper(), domain="rollout.v1")
        )
    return status_pb2.Status(
        code=err.code.value[0], message=err.message, details=[detail]
    ).SerializeToString()


# vLLM names the prompt after its OpenAI-shaped requests; ours has two fields.
_PROMPT_FIELD = "prompt_token_ids/prompt_text/messages"
_PROMPT_PARAMETERS = {"prompt", "decoder_prompt", "input", "input_tokens"}
# vLLM's prompt checks that set no parameter: "The decoder prompt (length
# 2048) plus ...", "The decoder prompt cannot be empty", "Token id 9 is out
# of vocabulary".
_PROMPT_MESSAGE = re.compile(r"\bprompt\b|^Token id ")
# SamplingParams checks mostly set no parameter but start with its name:
# "n must be 1 when using greedy sampling, got 64."
_LEADING_NAME = re.compile(r"`?([a-z][a-z_]*)`? ")
_SAMPLING_FIELDS = frozenset(pb.SamplingParams.DESCRIPTOR.fields_by_name)


def _vllm_field(e: Exception, message: str) -> str | None:
    """The request field a vLLM client error is about, in rollout.v1 terms,
    or None when it names no field of ours."""
    parameter = getattr(e, "parameter", None)
    if parameter is None:
        match = _LEADING_NAME.match(message)
        parameter = match.group(1) if match else None
    if parameter in _SAMPLING_FIELDS:
        return f"sampling_params.{parameter}"
    if parameter in _PROMPT_PARAMETERS or _PROMPT_MESSAGE.search(message):
        return _PROMPT_FIELD
    return None


def _invalid(e: Exception) -> InvalidArgument:
    # vLLM's errors that carry a parameter append "(parameter=..., value=...)"
    # to str(); the field we name replaces that, an unmapped one keeps it.
    message = Exception.__str__(e) if hasattr(e, "parameter") else str(e)
    field = _vllm_field(e, message)
    return InvalidArgument("request", str(e)) if field is None else InvalidArgument(field, message)


def from_exception(e: Exception) -> RpcError | None:
    """The status an exception that is not an RpcError maps to, or None for
    the unexpected (INTERNAL). vLLM is imported here, not at the top, so that
    the engine-free modules and tests importing this one stay fast."""
    from vllm.exceptions import MaxQueuedTokensError, QueueOverflowError, VLLMClientError
    from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

    if isinstance(e, (VLLMClientError, ValueError)):
        return _invalid(e)
    if isinstance(e, EngineGenerateError) and isinstance(e.__cause__, ValueError):
        # AsyncLLM.generate wraps every error but its own client errors; a
        # ValueError under it comes from input processing (e.g. "Multi-modal
        # processor not available for text-only models").
        return _invalid(e.__cause__)
    if isinstance(e, (QueueOverflowError, MaxQueuedTokensError)):
        return ResourceExhausted(e.message)
    if isinstance(e, EngineDeadError):
        return Unavailable("the engine has died; the server is shutting down")
    return None


async def abort(context: grpc.aio.ServicerContext, e: Exception, rpc: str) -> None:
    """Ends the call with the status for `e` (see the module docstring):
    known errors keep their status, the rest is logged and becomes INTERNAL.
    Always raises: context.abort raises AbortError, which passes through."""
    if isinstance(e, grpc.aio.AbortError):
        raise e
    err = e if isinstance(e, RpcError) else from_exception(e)
    if err is None:
        log.error("%s failed", rpc, exc_info=e)
        err = RpcError(f"{rpc} failed: {type(e).__name__}: {e}")
    elif err.code == grpc.StatusCode.INTERNAL:
        log.error("%s failed: %s", rpc, err.message)
    else:
        log.info("%s refused: %s %s", rpc, err.code.name, err.message)
    await context.abort(
        err.code, err.message, trailing_metadata=(("grpc-status-details-bin", status_details(err)),)
    )
