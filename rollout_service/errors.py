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
