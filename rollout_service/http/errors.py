"""One error policy for the HTTP front: what the pipeline raises (RpcErrors,
status/errors.py's policy for vLLM's and everything else), as OpenAI's JSON
error body with the HTTP status that matches the gRPC status (the table
grpc-gateway and Google's APIs use) and the same reason name:

    {"error": {"message": "...", "type": "invalid_request_error",
               "param": "max_tokens", "code": "INVALID_FIELD"}}

`param` is the request field at fault, named as the OpenAI request names it
(the pipeline names rollout.v1's fields: `sampling_params.max_tokens` is this
front's `max_tokens`). A RetryInfo hint becomes a Retry-After header.
"""

from __future__ import annotations

import math
from http import HTTPStatus

from fastapi.responses import JSONResponse

from rollout.v1 import rollout_pb2 as pb
from rollout_service.status.errors import (
    Code,
    InvalidArgument,
    RpcError,
    as_rpc_error,
    bounded,
    reason_name,
)

# gRPC status name -> HTTP status (google.rpc.Code's documented mapping).
HTTP_STATUS = {
    "INVALID_ARGUMENT": HTTPStatus.BAD_REQUEST,
    "FAILED_PRECONDITION": HTTPStatus.BAD_REQUEST,
    "OUT_OF_RANGE": HTTPStatus.BAD_REQUEST,
    "UNAUTHENTICATED": HTTPStatus.UNAUTHORIZED,
    "PERMISSION_DENIED": HTTPStatus.FORBIDDEN,
    "NOT_FOUND": HTTPStatus.NOT_FOUND,
    "ABORTED": HTTPStatus.CONFLICT,
    "ALREADY_EXISTS": HTTPStatus.CONFLICT,
    "RESOURCE_EXHAUSTED": HTTPStatus.TOO_MANY_REQUESTS,
    "CANCELLED": 499,  # the client closed the request
    "UNIMPLEMENTED": HTTPStatus.NOT_IMPLEMENTED,
    "UNAVAILABLE": HTTPStatus.SERVICE_UNAVAILABLE,
    "DEADLINE_EXCEEDED": HTTPStatus.GATEWAY_TIMEOUT,
    "INTERNAL": HTTPStatus.INTERNAL_SERVER_ERROR,
}
# OpenAI's error types, by HTTP status.
ERROR_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}

# rollout.v1 field names (as the pipeline's errors say them) -> this front's;
# PROMPT stands for the route's prompt field (messages, or prompt).
PROMPT = "{prompt}"
_RENAMES = (
    ("sampling_params.structured_output", "response_format"),
    ("sampling_params.logprobs", "top_logprobs"),
    ("sampling_params.", ""),
    ("prompt_token_ids/prompt_text/messages", PROMPT),
    ("prompt_token_ids", PROMPT),
    ("prompt_text", PROMPT),
    ("lora_adapter", "model"),
)
# The field an error with no field of its own is about.
_FIELD_OF_REASON = {pb.ERROR_REASON_WRONG_WEIGHT_VERSION: "required_weight_version"}


def openai_field(field: str, prompt_field: str = "messages") -> str:
    """A pipeline's field name as the OpenAI request names it."""
    for ours, theirs in _RENAMES:
        if field.startswith(ours):
            field = theirs.replace(PROMPT, prompt_field) + field[len(ours) :]
            break
    return field


# An HTTP status of the front's own -> the gRPC status it stands for (its log
# level: a caller's mistake is a refusal, logged at INFO, not a failure).
_CODE_OF_STATUS = {int(http): Code[name] for name, http in reversed(HTTP_STATUS.items())} | {
    413: Code.RESOURCE_EXHAUSTED,
    405: Code.UNIMPLEMENTED,
}


class HttpError(RpcError):
    """An error whose HTTP status is its own (a body over the size limit: 413;
    no credentials: 401, as gRPC's UNAUTHENTICATED)."""

    def __init__(
        self,
        status: int,
        message: str,
        field: str | None = None,
        reason: pb.ErrorReason = pb.ERROR_REASON_INVALID_FIELD,
    ) -> None:
        default = Code.INVALID_ARGUMENT if status < 500 else Code.INTERNAL
        super().__init__(message, code=_CODE_OF_STATUS.get(status, default), reason=reason)
        self.status = status
        self.field = field


def error_body(e: Exception, route: str, prompt_field: str = "messages"):
    """The HTTP status, OpenAI error body and headers for `e` (module
    docstring), logged as the gRPC front logs."""
    err = as_rpc_error(e, route)
    status = getattr(err, "status", None) or HTTP_STATUS.get(err.code.name, 500)
    param = getattr(err, "field", None) or _FIELD_OF_REASON.get(err.reason)
    message = err.message
    if isinstance(err, InvalidArgument) and param is not None:
        named = openai_field(param, prompt_field)
        message = named + message[len(param) :] if message.startswith(param) else message
        param = named
    body = {
        "error": {
            "message": bounded(message),
            "type": ERROR_TYPE.get(int(status), "server_error"),
            "param": param,
            # Our ErrorReason's name; none for HTTP's own (404, 405).
            "code": reason_name(err.reason) if err.reason else None,
        }
    }
    headers = {}
    if err.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(err.retry_after)))
    return int(status), body, headers


def error_response(e: Exception, route: str, prompt_field: str = "messages") -> JSONResponse:
    """`e` as an HTTP response (error_body)."""
    status, body, headers = error_body(e, route, prompt_field)
    return JSONResponse(body, status_code=status, headers=headers)
