"""Shared fixtures (the session's real-engine server on the default flags),
and the suite's order: tests that need no engine run first, so a broken
converter fails in seconds, not after the engine tests; `-m "not engine"`
(`scripts/test --fast`) runs only those.

A test needs an engine when it uses the session's `server` (directly or
through `client`/`info`), or its module starts servers of its own (imports
harness.serverproc's ServerProcess or running). It is marked `engine` here, so
the marker cannot go stale.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.certs import make_certs, python_tls, server_tls_args
from harness.serverproc import ServerProcess
from rollout_client import RolloutClient
from rollout_service.worker.weights_backend import FAULT_FILE_ENV


@pytest.fixture(scope="session")
def fault_file(tmp_path_factory):
    """While this file exists, the session server's engine fails to load
    weights (see weights_backend.FAULT_FILE_ENV)."""
    return tmp_path_factory.mktemp("fault") / "fail-next-load"


_shared: list[ServerProcess] = []  # the session server, once started


@pytest.fixture(scope="session")
def server(fault_file):
    """The embedded tiny-qwen2 model on a real vLLM engine, shared by every
    module on the default flags (each must leave it as `_left_clean` checks)."""
    proc = ServerProcess(env={FAULT_FILE_ENV: str(fault_file)})
    try:
        proc.wait_ready()
        _shared.append(proc)
        yield proc
    finally:
        _shared.clear()
        proc.stop(wait=False)


# The shared secure server's tokens: an admin, and two generate callers.
ADMIN, GENERATE, GENERATE_B = "admin-token", "gen-token", "gen-token-b"


@dataclass(frozen=True)
class Secure:
    """A server with bearer tokens and mutual TLS: the process, the
    certificate files, and RolloutClient's TLS arguments for them."""

    proc: ServerProcess
    certs: dict[str, Path]
    tls: dict


@pytest.fixture(scope="session")
def shared_secure(tmp_path_factory):
    """One tokens-and-mutual-TLS server for every module that needs one on
    these flags (the C++ and Node clients, the role table)."""
    tmp = tmp_path_factory.mktemp("secure")
    certs = make_certs(tmp)
    tokens = tmp / "tokens"
    tokens.write_text(f"admin:{ADMIN}\ngenerate:{GENERATE}\ngenerate:{GENERATE_B}\n")
    proc = ServerProcess("--tokens-file", str(tokens), *server_tls_args(certs))
    tls = python_tls(certs)
    try:
        proc.wait_ready(token=ADMIN, **tls)
        yield Secure(proc, certs, tls)
    finally:
        proc.stop(wait=False)


@pytest.fixture(autouse=True, scope="module")
def _left_clean(fault_file):
    """After each module: the shared server is not degraded, not asleep, and
    runs no request the module left behind, or the module fails here, loudly,
    instead of a later module failing for a reason of this one's."""
    yield
    if not _shared or _shared[0].proc.poll() is not None:
        return
    with RolloutClient(_shared[0].target, timeout=30, retries=0) as c:
        deadline = time.monotonic() + 15
        while (info := c.server_info()).engine_requests and time.monotonic() < deadline:
            time.sleep(0.1)
    problems = [
        what
        for what, bad in (
            ("degraded (an update failed inside the engine)", info.degraded),
            ("asleep", info.sleeping),
            (f"{info.engine_requests} engine requests still running", info.engine_requests),
            ("its fault file in place (the next update would fail)", fault_file.exists()),
        )
        if bad
    ]
    if problems:
        pytest.fail("this module left the shared server " + "; ".join(problems), pytrace=False)


@pytest.fixture(scope="session")
def client(server):
    with RolloutClient(server.target, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def info(client):
    return client.server_info()


_STARTS_SERVERS = ("ServerProcess", "running")


def _starts_servers(module) -> bool:
    return any(
        getattr(getattr(module, name, None), "__module__", None) == "harness.serverproc"
        for name in _STARTS_SERVERS
    )


def _needs_engine(item) -> bool:
    """The item's module, or the module of any fixture it uses, starts servers."""
    if {"server", "shared_secure"} & set(getattr(item, "fixturenames", ())):
        return True
    modules = {getattr(item, "module", None)}
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        # This file's fixtures start the session server only through `server`.
        modules.update(
            sys.modules.get(d.func.__module__) for d in defs if d.func.__module__ != __name__
        )
    return any(_starts_servers(m) for m in modules if m is not None)


def pytest_collection_modifyitems(config, items):
    engine = pytest.mark.engine
    for item in items:
        if _needs_engine(item):
            item.add_marker(engine)
    # Stable: within each group, the files' and tests' own order.
    items.sort(key=lambda item: item.get_closest_marker("engine") is not None)
