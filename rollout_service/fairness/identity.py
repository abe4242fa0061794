"""Who a call counts against for fair sharing.

- With auth on: its bearer token (a digest of it, as Abort and sessions
  scope by it), whatever metadata it sends: one token cannot pose as another.
- With auth off: the `rollout-tenant` metadata when the call sends it (any
  client can, so it is a label, not a credential: turn auth on to enforce
  shares between parties that do not trust each other), else its connection
  (gRPC's peer address: one channel is one caller).
"""

from __future__ import annotations

from dataclasses import dataclass

from rollout_service.ops.auth import CALLER
from rollout_service.status.errors import InvalidArgument

TENANT_HEADER = "rollout-tenant"
MAX_TENANT_CHARS = 64


@dataclass(frozen=True)
class CallerId:
    """`key` tells callers apart; `share_key` looks up its share
    (--caller-shares: a role, or `tenant:NAME`); `label` names it in
    metrics (connections share one label: their number is unbounded)."""

    key: str
    share_key: str
    label: str


def tenant_of(metadata) -> str | None:
    """The `rollout-tenant` metadata, checked: 1 to 64 printable ASCII
    characters, else INVALID_ARGUMENT naming it."""
    for k, v in metadata or ():
        if k == TENANT_HEADER:
            text = v if isinstance(v, str) else v.decode("latin-1")
            if not (0 < len(text) <= MAX_TENANT_CHARS and text.isascii() and text.isprintable()):
                raise InvalidArgument(
                    f"metadata {TENANT_HEADER}",
                    f"1 to {MAX_TENANT_CHARS} printable ASCII characters, got {text[:80]!r}",
                )
            return text
    return None


def caller_id(context) -> CallerId:
    """The caller of the call whose gRPC `context` this is."""
    caller = CALLER.get()
    if caller.owner:
        role = "admin" if caller.admin else "generate"
        short = f"{role}:{caller.owner[:12]}"
        return CallerId(f"token:{caller.owner}", role, short)
    tenant = tenant_of(context.invocation_metadata())
    if tenant is not None:
        return CallerId(f"tenant:{tenant}", f"tenant:{tenant}", f"tenant:{tenant}")
    return CallerId(f"peer:{context.peer()}", "", "connection")
