"""RolloutService: each RPC of rollout.v1, by name, to the method that
serves it.

The handlers are three plain classes built from one `Serving` (readiness.py),
which is how they reach the App and the pipeline: the generation RPCs and
the engine's facts (generation_rpcs.py), the session RPCs (session_rpcs.py),
the updates (update_rpcs.py). This module only puts them together, so the
classes import handlers.py's error policy and nothing imports them back.
"""

from __future__ import annotations

from collections.abc import Callable

from rollout.v1 import rollout_pb2 as pb
from rollout_service.rpc.generation_rpcs import GenerationRpcs
from rollout_service.rpc.handlers import register
from rollout_service.rpc.readiness import Serving
from rollout_service.rpc.session_rpcs import SessionRpcs
from rollout_service.rpc.update_rpcs import UpdateRpcs

SERVICE = pb.DESCRIPTOR.services_by_name["RolloutService"]


def rpc_methods(serving: Serving) -> dict[str, Callable]:
    """Every RPC of the proto's RolloutService to the one handler method
    that serves it; an RPC served by none, or by two, fails at start-up."""
    groups = (GenerationRpcs(serving), SessionRpcs(serving), UpdateRpcs(serving))
    methods = {}
    for rpc in SERVICE.methods:
        found = [getattr(group, rpc.name) for group in groups if hasattr(group, rpc.name)]
        if len(found) != 1:
            raise RuntimeError(f"{rpc.full_name} has {len(found)} handler methods, not one")
        methods[rpc.name] = found[0]
    return methods


def add_to_server(serving: Serving, server) -> None:
    """Registers every RPC, served over `serving` (before the server starts:
    gRPC takes no handlers later)."""
    register(rpc_methods(serving), server)
