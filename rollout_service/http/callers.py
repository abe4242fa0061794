"""Who an HTTP request is: the same tokens file and roles as gRPC
(ops/auth.py), the same fair-share identity (fairness/identity.py).

`Authorization: Bearer <token>` is checked as the gRPC interceptor checks
the `authorization` metadata: no token or an unknown one is 401
(AUTH_REQUIRED), a token without the role 403 (ROLE_DENIED); generating
needs the generate role, as Generate does. The caller it makes is set in
auth.CALLER for the request's task, so Abort (over gRPC) and the fair share
see HTTP calls exactly as they see gRPC ones: by token with auth on, else by
the `rollout-tenant` header, else by connection.
"""

from __future__ import annotations

from rollout.v1 import rollout_pb2 as pb
from rollout_service.fairness.identity import CallerId, caller_id
from rollout_service.http.errors import HttpError
from rollout_service.ops.auth import CALLER, ROLE_OF, Refusal, Tokens, check_bearer
from rollout_service.status.errors import PermissionDenied

# The role a generation needs: Generate's (auth.ROLE_OF, from the proto).
GENERATE = ROLE_OF.get("Generate", "generate")


class _Context:
    """What identity.caller_id reads of a gRPC context, from an HTTP request."""

    def __init__(self, request) -> None:
        self._request = request

    def invocation_metadata(self):
        return [(k, v) for k, v in self._request.headers.items() if k == "rollout-tenant"]

    def peer(self) -> str:
        client = self._request.client
        return f"http:{client.host}:{client.port}" if client else "http:unknown"


def authorize(tokens: Tokens | None, request, need: str = GENERATE) -> CallerId:
    """The request's caller, set in auth.CALLER; raises 401 or 403 (module
    docstring) before anything else runs."""
    if tokens is not None:
        caller = check_bearer(tokens, request.headers.get("authorization", ""), need)
        if isinstance(caller, Refusal):
            raise _refused(caller)
        CALLER.set(caller)
    return caller_id(_Context(request))


def _refused(refusal: Refusal) -> HttpError | PermissionDenied:
    """401 (AUTH_REQUIRED) without a known token, 403 (ROLE_DENIED) without the role."""
    if refusal.why == "missing":
        return HttpError(
            401,
            "missing credentials: send 'Authorization: Bearer <token>'",
            reason=pb.ERROR_REASON_AUTH_REQUIRED,
        )
    if refusal.why == "unknown":
        return HttpError(401, "unknown token", reason=pb.ERROR_REASON_AUTH_REQUIRED)
    return PermissionDenied(
        f"this route needs the admin role; this token has {refusal.role!r}",
        reason=pb.ERROR_REASON_ROLE_DENIED,
    )
