"""The suite's pytest hooks, a plugin conftest.py loads (`pytest_plugins`):
the servers' start-up (tests.support.server_starts) tied to collection and to
each module's first test, every test that needs an engine marked `engine`,
and the suite's order.

The tree is by tier, then concern: tests/unit/ (engine-free, by package),
tests/engine/, tests/clients/, tests/repo/ (engine-free checks of the
repository); a test under tests/unit/ or tests/repo/ that needs an engine is
refused at collection. Tests that need no engine run first, so a broken converter fails in seconds,
not after the engine tests; `-m "not engine"` (`scripts/test --fast`) runs
only those. A test needs an engine when it uses a server fixture of
conftest.py (directly or through another fixture), or its module, or the
module of any other fixture it uses, starts servers (imports
harness.serverproc's ServerProcess or running). The marker is set here, from
what each test uses, so it cannot go stale.

Time that would be waited out is moved: a test's idle minute on a shared
server (an engine stopped, calls waiting) runs in the background while the
engine-free tests run (tests.support.idle_ahead), and those run in two
processes when engine tests follow (tests.support.companion); `late` tests
(the C++ client's, which wait for its build) run after the rest, engine-free
ones included, so that the build has had the run's idle CPU instead.
"""

from __future__ import annotations

import signal
import sys

import pytest

from tests.support import (
    cpp_build,
    idle_ahead,
    serve_forks,
    server_starts,
    shared_servers,
    verl_drive,
)

_STARTS_SERVERS = ("ServerProcess", "running")
# The module before whose tests the first verl drive's process starts.
_verl_ahead: list[str | None] = []


def pytest_configure(config):
    # A run started in the background by a shell without job control (`cmd &`
    # in a script) inherits SIGINT ignored, and so would every process it
    # starts: the tests that stop a command with Ctrl-C (SIGINT) would find it
    # ignored there. Python's own handler, as in a terminal.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    config.addinivalue_line(
        "markers",
        "late: waits for work started in the background at collection (the C++"
        " client's build): runs after every other test but those marked last",
    )


# The folders whose tests need no engine: a test there that needs one is
# refused at collection (it belongs under tests/engine/ or tests/clients/).
ENGINE_FREE = ("tests/unit/", "tests/repo/")


def misplaced(nodeid: str, needs_engine: bool) -> bool:
    return needs_engine and nodeid.startswith(ENGINE_FREE)


def pytest_collection_modifyitems(config, items):
    engine = pytest.mark.engine
    for item in items:
        if _needs_engine(item):
            if misplaced(item.nodeid, True):
                raise pytest.UsageError(
                    f"{item.nodeid} needs an engine: tests under {' and '.join(ENGINE_FREE)} "
                    "need none (move it under tests/engine/ or tests/clients/)"
                )
            item.add_marker(engine)
    # Stable: within each group, the files' and tests' own order; late
    # tests, engine-free or not, after the engine tests; a test that stops a
    # shared server after all that may use it.
    items.sort(
        key=lambda item: (
            item.get_closest_marker("engine") is not None
            or item.get_closest_marker("late") is not None,
            item.get_closest_marker("last") is not None,
            item.get_closest_marker("late") is not None,
        )
    )


def pytest_collection_finish(session):
    """The shared servers the collected tests use start now, all at once,
    the idle scenarios of the collected tests on them once they are ready,
    and the C++ client's build if its tests were collected."""
    server_starts.start_collected(session.items)
    idle_ahead.start_collected(session.items)
    if any(item.nodeid.startswith(cpp_build.MODULE) for item in session.items):
        cpp_build.start()
    _verl_ahead[:] = [verl_drive.start_ahead_of(session.items)]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before a module's first test: its own servers, if not yet started,
    and those of the next modules that have any; before the module that
    precedes the first verl drive, that drive's process."""
    module = item.nodeid.split("::")[0]
    server_starts.start_for(module)
    if module in _verl_ahead:
        _verl_ahead.clear()
        verl_drive.start_ahead()


def pytest_sessionfinish(session):
    server_starts.stop_unused()


def pytest_terminal_summary(terminalreporter):
    """How the servers started (forked or not, and why not); which modules
    left other weights on a shared server (put back after the module): each
    costs a full update, and none may count on another's."""
    if serve_forks.counts:
        started = ", ".join(f"{n} {why}" for why, n in sorted(serve_forks.counts.items()))
        terminalreporter.write_line(
            f"rollout-service starts (tests/support/serve_forks.py): {started}"
        )
    if shared_servers.restored:
        lines = [f"{module} (the {name})" for module, name in shared_servers.restored]
        terminalreporter.write_line("weights restored after: " + ", ".join(lines))


def _starts_servers(module) -> bool:
    return any(
        getattr(getattr(module, name, None), "__module__", None) == "harness.serverproc"
        for name in _STARTS_SERVERS
    )


def _is_conftest(module_name: str) -> bool:
    return module_name.rpartition(".")[2] == "conftest"


def _needs_engine(item) -> bool:
    """The item uses a server fixture of conftest.py, or its module, or the
    module of any fixture it uses, starts servers."""
    if server_starts.server_fixtures() & set(getattr(item, "fixturenames", ())):
        return True
    modules = {getattr(item, "module", None)}
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        # conftest.py's fixtures start servers only through the server
        # fixtures it declares (server_starts.declare), checked above.
        modules.update(
            sys.modules.get(d.func.__module__) for d in defs if not _is_conftest(d.func.__module__)
        )
    return any(_starts_servers(m) for m in modules if m is not None)
