"""When the suite's server fixtures' processes start: the shared servers all
at once as soon as the tests are collected, and each module's own servers
while the modules before it run (AHEAD modules with own servers ahead).

A start is ~20 s of mostly single-threaded imports: started early, starts
overlap each other and the tests that run meanwhile (the engine-free tests
run first), instead of each costing the suite its full start-up. conftest.py
declares how each fixture's process starts; tests.support.orchestration's
hooks say when.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from harness.serverproc import ServerProcess

# Shared servers (session fixtures) by fixture: a start returns the process
# and what else its fixture needs.
_shared: dict[str, Callable[[], tuple[ServerProcess, Any]]] = {}
# Servers one module has to itself (module fixtures) by fixture: a start
# returns a process, or a dict of them.
_own: dict[str, Callable[[], Any]] = {}

_early: dict = {}  # shared servers started at collection, not yet taken
# Per module, in run order, the own-server fixtures it uses; which of them
# (by index) have been started; and what was started for each fixture, in
# the order the modules will take them.
_ahead_uses: list[tuple[str, list[str]]] = []
_ahead_started: set[int] = set()
_ahead: dict[str, list] = {}


def declare(
    shared: dict[str, Callable[[], tuple[ServerProcess, Any]]],
    own: dict[str, Callable[[], Any]],
) -> None:
    """How each server fixture's process starts: `shared` for the session
    fixtures, `own` for the module fixtures."""
    _shared.update(shared)
    _own.update(own)


def server_fixtures() -> set[str]:
    """Every fixture that starts servers; no other fixture of conftest.py does."""
    return set(_shared) | set(_own)


def early(fixture: str) -> ServerProcess | None:
    """The shared server started at collection for `fixture`, if not yet taken."""
    started = _early.get(fixture)
    return started[0] if started else None


def started(fixture: str) -> tuple[ServerProcess, Any]:
    """The shared server started early for `fixture`, or one started now."""
    return _early.pop(fixture, None) or _shared[fixture]()


def _processes(servers) -> list[ServerProcess]:
    return list(servers.values()) if isinstance(servers, dict) else [servers]


@contextmanager
def own(fixture: str) -> Iterator[Any]:
    """What was started ahead for `fixture` (the next module's in run order),
    or started now; ready, and stopped after the block."""
    queue = _ahead.get(fixture)
    servers = queue.pop(0) if queue else _own[fixture]()
    try:
        for proc in _processes(servers):
            # A server with TLS says how to reach it (`ready_options`).
            proc.wait_ready(**getattr(proc, "ready_options", {}))
        yield servers
    finally:
        for proc in _processes(servers):
            proc.stop(wait=False)


def start_collected(items) -> None:
    """Starts every shared server the collected `items` use, and notes, per
    module in run order, the own servers it uses."""
    used = set()
    for item in items:
        used.update(getattr(item, "fixturenames", ()))
    for fixture in _shared.keys() & used:
        _early[fixture] = _shared[fixture]()
    for item in items:
        module = item.nodeid.split("::")[0]
        if not _ahead_uses or _ahead_uses[-1][0] != module:
            _ahead_uses.append((module, []))
        uses = _ahead_uses[-1][1]
        uses.extend(f for f in _own if f in item.fixturenames and f not in uses)


def _start_ahead(index: int) -> None:
    if index < len(_ahead_uses) and index not in _ahead_started:
        _ahead_started.add(index)
        for fixture in _ahead_uses[index][1]:
            _ahead.setdefault(fixture, []).append(_own[fixture]())


# How many of the next modules that have own servers get them started while
# a module runs: one is not enough when the module between is short (its
# servers then start when it begins, and it waits for them).
AHEAD = 2


def start_for(module: str) -> None:
    """Before `module`'s first test: its own servers, if not yet started, and
    those of the next AHEAD modules that have any (they start while this one
    runs)."""
    for index, (name, _) in enumerate(_ahead_uses):
        if name == module:
            _start_ahead(index)
            later = [i for i in range(index + 1, len(_ahead_uses)) if _ahead_uses[i][1]]
            for i in later[:AHEAD]:
                _start_ahead(i)
            break


def stop_unused() -> None:
    """Stops what was started and never taken (a run stopped early)."""
    for proc, _ in _early.values():
        proc.stop(wait=False)
    for queue in _ahead.values():
        for servers in queue:
            for proc in _processes(servers):
                proc.stop(wait=False)
