"""Idle scenarios run ahead: a test that holds a shared server still for a
minute (its engine stopped, calls waiting on the wire) runs that minute in a
thread while the engine-free tests run, instead of as a minute of the engine
tests' own.

A test declares its scenario with the decorator `runs_ahead`; once the tests
are collected, tests.support.orchestration starts the scenarios of the
collected tests (`start_collected`), each on the shared server started early
for its fixture, as soon as that server is ready. The fixture waits for them
before any test uses the server (`wait_for`), and the test asserts what its
scenario saw (`outcome`).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from threading import Thread
from typing import Any

from harness.serverproc import ServerProcess
from tests.support import server_starts

# Time for a scenario once its server is ready; past it the fixture goes on
# and the test fails with the scenario's state.
SCENARIO_SECONDS = 300.0


@dataclass
class _Scenario:
    fixture: str
    run: Callable[[ServerProcess], Any]
    done: Future | None = None


_registered: dict[str, _Scenario] = {}  # by test function (_key)


def _key(test: Callable) -> str:
    return f"{test.__module__}.{test.__qualname__}"


def runs_ahead(fixture: str, run: Callable[[ServerProcess], Any]) -> Callable[[Callable], Callable]:
    """A decorator: `run(server)` is the decorated test's idle minute, on the
    shared server of `fixture` (a session fixture of conftest.py); what it
    returns is the test's `outcome`."""

    def register(test: Callable) -> Callable:
        _registered[_key(test)] = _Scenario(fixture, run)
        return test

    return register


def _in_thread(scenario: _Scenario, proc: ServerProcess, done: Future) -> None:
    try:
        proc.wait_ready()
        done.set_result(scenario.run(proc))
    except BaseException as e:  # the test re-raises it
        done.set_exception(e)


def start_collected(items) -> None:
    """Starts the scenario of every collected test that registered one."""
    collected = {_key(item.function) for item in items if hasattr(item, "function")}
    for test, scenario in _registered.items():
        proc = server_starts.early(scenario.fixture)
        if test in collected and proc is not None:
            scenario.done = Future()
            Thread(target=_in_thread, args=(scenario, proc, scenario.done), daemon=True).start()


def wait_for(fixture: str) -> None:
    """Until the scenarios started on `fixture`'s server have ended."""
    for scenario in _registered.values():
        if scenario.fixture == fixture and scenario.done is not None:
            try:
                scenario.done.exception(timeout=SCENARIO_SECONDS)
            except TimeoutError:
                pass


def outcome(test: Callable) -> Any:
    """What the scenario of `test` (a test function) returned (its error
    raised)."""
    done = _registered[_key(test)].done
    assert done is not None, f"{test.__name__}'s scenario did not start: its server was not early"
    return done.result(timeout=SCENARIO_SECONDS)
