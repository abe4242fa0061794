"""One error policy for every front.

Handlers and the pipeline only raise; `as_rpc_error` turns what they raise
into one status (a `Code`, the numbers gRPC's status codes carry, and a
documented ErrorReason), which each front sends its own way: the gRPC
front's `abort` (rpc/statuses.py, with trailers.py's details), the HTTP
front's error body. Nothing
here imports gRPC, so a front that is not gRPC imports none of it.

    raised                                   status
    RpcError subclasses (ours)               their own code (NotFound, PermissionDenied,
                                               FailedPrecondition, Aborted, ...)
    vLLM's VLLMClientError (VLLMValidation-  INVALID_ARGUMENT naming the field
      Error, ...; not a ValueError)            ("sampling_params.n: ...")
    ValueError (vLLM's unmigrated checks)    INVALID_ARGUMENT, likewise
    EngineGenerateError caused by a          INVALID_ARGUMENT, likewise (vLLM
      ValueError                               wraps input-processing errors)
    vLLM's QueueOverflowError,               RESOURCE_EXHAUSTED, as our own
      MaxQueuedTokensError                     --max-queued-generate
    EngineDeadError                          UNAVAILABLE
    anything else                            INTERNAL, logged with its traceback
    grpc.aio.AbortError (rpc/statuses.py)    re-raised: the call has ended
    asyncio.CancelledError                   passes (it is a BaseException)

Log lines carry the call's request id through `logs.request_id`.

Messages are bounded. A status travels in the call's trailers: the message in
grpc-message (percent-encoded, up to 3 bytes a byte) and twice more, as the
google.rpc.Status message and the field violation's description, in
grpc-status-details-bin (base64). Over gRPC's metadata limit (8 KiB soft,
16 KiB hard by default) the caller gets "Stream removed" instead of the
status, so a caller's 12,000-character name echoed whole would hide its own
error. Echo sites quote caller input with `short_repr`; every RpcError's
message is cut to MAX_MESSAGE_BYTES here, whatever its sites did.
"""

from __future__ import annotations

import enum
import logging
import re
import reprlib

from rollout.v1 import rollout_pb2 as pb

log = logging.getLogger(__name__)


# The worst case of the three copies stays near 6 KiB with these.
MAX_MESSAGE_BYTES = 1024
MAX_FIELD_BYTES = 200
# Caller input quoted in a message: room for a long tensor name.
ECHO_CHARS = 120

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = ECHO_CHARS
_REPR.maxlist = _REPR.maxdict = _REPR.maxtuple = 4
_REPR.maxlevel = 2


def short_repr(value: object) -> str:
    """`value`, from the caller, quoted for a status message: a string as
    ascii() (control and non-ASCII characters escaped, so the message stays
    one readable line), cut to ECHO_CHARS with its length said; anything
    else (a JSON value) through reprlib, which cuts long containers."""
    if isinstance(value, str):
        if len(value) <= ECHO_CHARS:
            return ascii(value)
        return f"{ascii(value[:ECHO_CHARS])}... ({len(value)} characters)"
    return _REPR.repr(value)


def bounded(text: str, max_bytes: int = MAX_MESSAGE_BYTES) -> str:
    """`text` in at most `max_bytes` bytes of UTF-8, cut with a note if
    longer. Lone surrogates (from an exception's text) become escapes, so
    that gRPC can always encode the result."""
    data = text.encode("utf-8", "backslashreplace")
    if len(data) <= max_bytes:
        return data.decode("utf-8")
    note = f" ... (cut: {len(data)} bytes)"
    return data[: max_bytes - len(note)].decode("utf-8", "ignore") + note


class Code(enum.IntEnum):
    """A status code: google.rpc.Code, the numbers (and names) of gRPC's
    status codes, which the HTTP front maps to HTTP statuses."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class RpcError(Exception):
    """An error that maps to one status code and one documented
    rollout.v1.ErrorReason (each class has a default; raise sites whose
    cause differs name theirs)."""

    code: Code = Code.INTERNAL
    reason: pb.ErrorReason = pb.ERROR_REASON_INTERNAL_ERROR

    def __init__(
        self,
        message: str,
        code: Code | None = None,
        reason: pb.ErrorReason | None = None,
        retry_after: float | None = None,
    ) -> None:
        message = bounded(message)
        super().__init__(message)
        self.message = message
        # Seconds: sent as a google.rpc.RetryInfo (a hint to retry after it).
        self.retry_after = retry_after
        if code is not None:
            self.code = code
        if reason is not None:
            self.reason = reason


class InvalidArgument(RpcError):
    """The request is malformed; the message names the field."""

    code = Code.INVALID_ARGUMENT
    reason = pb.ERROR_REASON_INVALID_FIELD

    def __init__(self, field: str, problem: str) -> None:
        field = bounded(field, MAX_FIELD_BYTES)
        super().__init__(f"{field}: {problem}")
        self.field = field


class FailedPrecondition(RpcError):
    """The request conflicts with the server's state (version, degraded, ...)."""

    code = Code.FAILED_PRECONDITION
    reason = pb.ERROR_REASON_DEGRADED


class NotFound(RpcError):
    """What the request names does not exist here (a session)."""

    code = Code.NOT_FOUND
    reason = pb.ERROR_REASON_SESSION_NOT_FOUND


class PermissionDenied(RpcError):
    """What the request names belongs to another caller (a session)."""

    code = Code.PERMISSION_DENIED
    reason = pb.ERROR_REASON_SESSION_NOT_OWNED


class Aborted(RpcError):
    """The request lost a race with another one (e.g. a concurrent update)."""

    code = Code.ABORTED
    reason = pb.ERROR_REASON_UPDATE_IN_PROGRESS


class ResourceExhausted(RpcError):
    """The request goes over a configured limit; the message names it."""

    code = Code.RESOURCE_EXHAUSTED
    reason = pb.ERROR_REASON_LIMIT_EXCEEDED


class DeadlineExceeded(RpcError):
    """Work that waited too long on the caller (a stalled update)."""

    code = Code.DEADLINE_EXCEEDED
    reason = pb.ERROR_REASON_UPDATE_IDLE_TIMEOUT


class Unavailable(RpcError):
    """The server cannot serve right now (starting, engine dead)."""

    code = Code.UNAVAILABLE
    reason = pb.ERROR_REASON_ENGINE_DEAD


def engine_dead() -> Unavailable:
    """What every call gets once the engine has died."""
    return Unavailable("the engine has died; the server is shutting down")


def shutting_down() -> Unavailable:
    """What a call gets once a signal stopped the server: sent while the
    calls in flight drain, or still running when their grace ends."""
    return Unavailable(
        "the server is shutting down; retry on another replica or once it has restarted",
        reason=pb.ERROR_REASON_SHUTTING_DOWN,
    )


def reason_name(reason: pb.ErrorReason) -> str:
    """ErrorInfo.reason: the ErrorReason's name without its prefix."""
    return pb.ErrorReason.Name(reason).removeprefix("ERROR_REASON_")


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
        return ResourceExhausted(e.message, reason=pb.ERROR_REASON_QUEUE_FULL)
    if isinstance(e, EngineDeadError):
        return engine_dead()
    return None


def as_rpc_error(e: Exception, rpc: str) -> RpcError:
    """The status for `e` (see the module docstring), logged: known errors
    keep their status, the rest becomes INTERNAL with its traceback."""
    err = e if isinstance(e, RpcError) else from_exception(e)
    if err is None:
        log.error("%s failed", rpc, exc_info=e)
        err = RpcError(f"{rpc} failed: {type(e).__name__}: {e}")
    elif err.code == Code.INTERNAL:
        log.error("%s failed: %s", rpc, err.message)
    else:
        log.info("%s refused: %s %s", rpc, err.code.name, err.message)
    return err
