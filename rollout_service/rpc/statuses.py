"""The gRPC front's end of the error policy (status/errors.py): a call ends
with the status for what its handler raised, its ErrorReason and details in
the trailers every language's status helpers read."""

from __future__ import annotations

import grpc

from rollout_service.status.errors import Code, InvalidArgument, as_rpc_error
from rollout_service.status.trailers import details_trailer

_GRPC = {c.value[0]: c for c in grpc.StatusCode}


def grpc_code(code: Code) -> grpc.StatusCode:
    return _GRPC[int(code)]


async def abort(context: grpc.aio.ServicerContext, e: Exception, rpc: str) -> None:
    """Ends the call with the status for `e` (as_rpc_error). Always raises:
    context.abort raises AbortError, which passes through."""
    if isinstance(e, grpc.aio.AbortError):
        raise e
    err = as_rpc_error(e, rpc)
    violation = (err.field, err.message) if isinstance(err, InvalidArgument) else None
    await context.abort(
        grpc_code(err.code),
        err.message,
        trailing_metadata=details_trailer(
            err.code, err.message, err.reason, violation, err.retry_after
        ),
    )
