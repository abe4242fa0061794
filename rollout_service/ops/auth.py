"""Bearer-token authentication with two roles: the tokens, the role each RPC
needs and the caller of the running call (the gRPC front's interceptor that
checks them is grpc_auth.py; the HTTP front checks the same tokens and roles,
both through `check_bearer`).

`ROLE_OF` says which role may call each RPC, read from the one place that
declares it: the RPC's `(rollout.v1.role)` option in the proto
(proto/rollout/v1/options.proto). `generate` may generate, tokenize, read
the server's info, use its own sessions and abort its own calls; `admin` may
call everything. Health checking and reflection stay
open unless `protect_health` is set. A call without a known token gets
UNAUTHENTICATED; a known token without the role gets PERMISSION_DENIED,
before the call runs.

Abort is scoped by caller: the interceptor records who is calling
(`CALLER`, a context variable set inside the call's task and inherited by the
tasks it starts), the running-calls registry keeps each call's owner, and a
generate-role Abort only sees calls started with the same token.

Tokens never come from the command line (it is visible in `ps`): a file of
`role:token` lines, or the same comma-separated in an environment variable.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal

from google.protobuf.descriptor import ServiceDescriptor

from rollout.v1 import options_pb2
from rollout.v1 import rollout_pb2 as pb

ROLES = ("generate", "admin")
TOKENS_ENV = "ROLLOUT_SERVICE_TOKENS"


def roles_of(service: ServiceDescriptor) -> dict[str, str]:
    """Each RPC's least role (admin may call everything), as its
    `(rollout.v1.role)` option in the proto declares it; "admin" where
    none is declared, so an RPC added without one is refused to the rest."""
    roles = {}
    for method in service.methods:
        # protoc's .pyi types the extension as a plain FieldDescriptor, which
        # types-protobuf's Extensions does not take as an index.
        declared: options_pb2.Role = method.GetOptions().Extensions[options_pb2.role]  # type: ignore[index]
        roles[method.name] = _ROLE_NAMES.get(declared, "admin")
    return roles


_ROLE_NAMES = {options_pb2.ROLE_GENERATE: "generate", options_pb2.ROLE_ADMIN: "admin"}
ROLE_OF = roles_of(pb.DESCRIPTOR.services_by_name["RolloutService"])
_SERVICE = "/rollout.v1.RolloutService/"


@dataclass(frozen=True)
class Caller:
    """Who is calling: `owner` tells callers apart (a digest of their token,
    "" with auth off), `admin` whether they may act on others' calls."""

    owner: str = ""
    admin: bool = True


# The current call's caller; with auth off every call is an admin's.
# (Caller is frozen: a shared default is safe.)
CALLER: ContextVar[Caller] = ContextVar("rollout_caller", default=Caller())  # noqa: B039


@dataclass(frozen=True)
class Tokens:
    """Role of each token."""

    by_token: dict[str, str]

    @classmethod
    def parse(cls, entries: Iterable[str], source: str) -> Tokens:
        by_token: dict[str, str] = {}
        for n, raw in enumerate(entries, 1):
            entry = raw.strip()
            if not entry or entry.startswith("#"):
                continue
            role, sep, token = entry.partition(":")
            role, token = role.strip(), token.strip()
            if not sep or role not in ROLES or not token:
                raise ValueError(
                    f"{source}, entry {n}: expected 'ROLE:TOKEN' with ROLE one of {ROLES}"
                )
            by_token[token] = role
        if not by_token:
            raise ValueError(f"{source}: no tokens")
        return cls(by_token)

    @classmethod
    def load(cls, path: str | None) -> Tokens | None:
        """From `path` (one `role:token` a line), else $ROLLOUT_SERVICE_TOKENS
        (comma-separated), else None: auth off."""
        if path:
            with open(path) as f:
                return cls.parse(f.read().splitlines(), path)
        env = os.environ.get(TOKENS_ENV)
        if env:
            return cls.parse(env.split(","), f"${TOKENS_ENV}")
        return None

    def role_of(self, token: str) -> str | None:
        # Compare every token in constant time: no early exit leaks a prefix.
        found = None
        for known, role in self.by_token.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                found = role
        return found


def required_role(method: str) -> str | None:
    """The role a full method name needs, or None when it is open."""
    if method.startswith(_SERVICE):
        return ROLE_OF.get(method[len(_SERVICE) :], "admin")
    return None


def caller_for(token: str, role: str) -> Caller:
    """The caller a known token with `role` names, on either front: its
    owner key (the token's hash, never the token) and whether it is admin."""
    return Caller(owner=hashlib.sha256(token.encode()).hexdigest()[:16], admin=role == "admin")


@dataclass(frozen=True)
class Refusal:
    """Why a bearer header does not admit a call: no bearer token
    (`missing`) or an `unknown` one, which each front answers as
    unauthenticated; or a token whose `role` lacks the admin role needed."""

    why: Literal["missing", "unknown", "role"]
    role: str = ""


def check_bearer(tokens: Tokens, header: str, need: str) -> Caller | Refusal:
    """The caller an `authorization: Bearer <token>` header names when its
    token has the role `need` (admin may call everything), else why not: the
    one check both fronts make before a call runs, each in its own words."""
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return Refusal("missing")
    role = tokens.role_of(token)
    if role is None:
        return Refusal("unknown")
    if need == "admin" and role != "admin":
        return Refusal("role", role)
    return caller_for(token, role)
