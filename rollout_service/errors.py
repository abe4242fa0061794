"""One error policy for every RPC.

Handlers raise `RpcError` subclasses for anything the caller should see; the
servicer turns them into a gRPC status whose message names the problem.
Anything else is logged with the request id and becomes INTERNAL.
"""

from __future__ import annotations

import grpc


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
