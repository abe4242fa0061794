"""The tensor-parallel layouts tests/engine/generation/test_parallel.py serves (their servers
start a module ahead: tests/conftest.py)."""

from __future__ import annotations

import pytest

from harness.serverproc import ServerProcess
from rollout_service.engine.placement import BIND_ENV

LAYOUTS = {"every rank reads": (), "rank 0 broadcasts": ("--weight-broadcast",)}


def start_tp2_servers() -> dict[str, ServerProcess]:
    """One TP=2 server per layout, started at once (a start is mostly
    imports, one core each). Two CPU workers on one NUMA node: vLLM's own
    binding fails, the server binds a core to each (nothing set by hand)."""
    with pytest.MonkeyPatch.context() as env:
        env.delenv(BIND_ENV, raising=False)
        procs = {
            name: ServerProcess("--tensor-parallel-size", "2", *extra)
            for name, extra in LAYOUTS.items()
        }
    for name, proc in procs.items():
        proc.broadcast = bool(LAYOUTS[name])  # type: ignore[attr-defined]
    return procs
