"""The gRPC front's auth interceptor: `authorization: Bearer <token>`
metadata checked against the role each method needs (auth.py), before the
call runs; the caller recorded for Abort's scoping."""

from __future__ import annotations

import grpc

from rollout.v1 import rollout_pb2 as pb
from rollout_service.ops.auth import CALLER, Refusal, Tokens, check_bearer, required_role
from rollout_service.ops.shapes import around, like
from rollout_service.status.trailers import details_trailer

# Open unless --protect-health: health checking and reflection.
_OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def _denied(handler, refusal: Refusal, method: str):
    """A handler of the same shape as `handler` that fails the call:
    UNAUTHENTICATED (AUTH_REQUIRED) or PERMISSION_DENIED (ROLE_DENIED)."""
    code = grpc.StatusCode.UNAUTHENTICATED
    reason = pb.ERROR_REASON_AUTH_REQUIRED
    if refusal.why == "missing":
        message = "missing credentials: send 'authorization: Bearer <token>' metadata"
    elif refusal.why == "unknown":
        message = "unknown token"
    else:
        code = grpc.StatusCode.PERMISSION_DENIED
        reason = pb.ERROR_REASON_ROLE_DENIED
        message = (
            f"{method.rsplit('/', 1)[1]} needs the admin role; this token has '{refusal.role}'"
        )
    trailer = details_trailer(code, message, reason)

    async def unary(request, context):
        await context.abort(code, message, trailing_metadata=trailer)

    async def streaming(request, context):
        await context.abort(code, message, trailing_metadata=trailer)
        yield  # pragma: no cover - makes this an async generator

    return like(handler, streaming if handler.response_streaming else unary)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks `authorization: Bearer <token>` against the role a method needs."""

    def __init__(self, tokens: Tokens, protect_health: bool = False) -> None:
        self.tokens = tokens
        self.protect_health = protect_health

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        need = required_role(method)
        if need is None:
            if not (self.protect_health and method.startswith(_OPEN_SERVICES)):
                return handler
            need = "generate"
        header = dict(details.invocation_metadata or ()).get("authorization", "")
        caller = check_bearer(self.tokens, header, need)
        if isinstance(caller, Refusal):
            return _denied(handler, caller, method)
        if method.startswith(_OPEN_SERVICES):
            return handler
        # Set inside the call's own task (the handler runs there, not here).
        return around(handler, lambda: CALLER.set(caller), lambda *_: None)
