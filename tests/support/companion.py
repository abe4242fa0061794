"""The engine-free tests in two processes: a pytest plugin (conftest.py
loads it after tests.support.orchestration).

The engine-free tests run first, in one process, while the shared servers
start and the keepalive scenario waits: a phase of mostly one busy core (its
tests wait on subprocesses, graces and retries). When a run collects engine
tests too, the main process starts a companion pytest on the same
engine-free tests; the two go down the same ordered list and each runs the
modules it claims first (a file created with O_EXCL per module, so a
module's fixtures stay in one process), the other skipping them. The
companion sends what pytest reports of each test (pytest's own
serialization, as pytest-xdist does) through a file; the main process
reports them as its own before each of its tests and at the end, so the
counts, failures, durations and exit status are the run's whole. A test the
companion claimed and never reported (it died) fails, with its output.

Engine tests, `late` and `last` tests never go to the companion, and a run
of engine-free tests only (`-m "not engine"`) has none.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# Set in the companion's environment: the folder the two processes share.
ENV = "ROLLOUT_TESTS_COMPANION"
_IN_COMPANION = ENV in os.environ
# Not for the companion: tests that need an engine, wait for background
# work (`late`) or stop a shared server (`last`).
STAYS = ("engine", "late", "last")
# How long the main process waits, after its own tests, for the companion.
END_SECONDS = 900


@dataclass
class _State:
    folder: Path | None = None  # shared with the other process
    candidates: set[str] = field(default_factory=set)  # the tests either may run
    owned: dict[str, bool] = field(default_factory=dict)  # by module: claimed by this process
    proc: subprocess.Popen | None = None  # the companion, in the main process
    read: int = 0  # bytes of the companion's reports forwarded so far
    reported: set[str] = field(default_factory=set)  # tests the companion reported
    config: pytest.Config | None = None  # the companion's (a report hook is not given it)
    pending: list[dict] = field(default_factory=list)  # the companion's current test's reports


_state = _State()


def _module(nodeid: str) -> str:
    return nodeid.split("::")[0]


def claim(folder: Path, module: str) -> bool:
    """True for the first of the two processes to ask for `module`."""
    name = hashlib.sha256(module.encode()).hexdigest()[:32]
    try:
        os.close(os.open(folder / "claims" / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def shared_folder() -> Path | None:
    """The folder the main process and its companion share (for work both
    would otherwise do twice; known once the tests are collected), or None
    when the run has no companion."""
    return _state.folder


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """In the main process: whether a companion runs, and on which tests
    (after orchestration has marked and ordered them)."""
    if _IN_COMPANION:
        _state.folder = Path(os.environ[ENV])
        _state.candidates = {item.nodeid for item in items}
        return
    shares = [i for i in items if not any(i.get_closest_marker(m) for m in STAYS)]
    if len(shares) == len(items) or len({_module(i.nodeid) for i in shares}) < 2:
        return
    folder = Path(tempfile.mkdtemp(prefix="rollout-companion-"))
    (folder / "claims").mkdir()
    (folder / "ids").write_text("".join(f"{i.nodeid}\n" for i in shares))
    (folder / "reports").touch()
    _state.folder, _state.candidates = folder, {i.nodeid for i in shares}


def pytest_collection_finish(session):
    if _state.folder is None or _IN_COMPANION:
        return
    folder = _state.folder
    with open(folder / "log", "wb") as log:
        _state.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"@{folder / 'ids'}"],
            cwd=session.config.rootpath,
            env={**os.environ, ENV: str(folder)},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _runs_elsewhere(nodeid: str) -> bool:
    module = _module(nodeid)
    if module not in _state.owned:
        assert _state.folder is not None
        _state.owned[module] = claim(_state.folder, module)
    return not _state.owned[module]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Skips the tests of a module the other process claimed; in the main
    process, first reports what the companion has reported since."""
    if _state.folder is None:
        return None
    if not _IN_COMPANION:
        _forward(item.config)
    if item.nodeid in _state.candidates and _runs_elsewhere(item.nodeid):
        # What a test's teardown does: down to what the next test needs (the
        # test before this one kept what this one would have needed).
        item.session._setupstate.teardown_exact(nextitem)
        return True
    return None


def pytest_configure(config):
    _state.config = config


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    if _IN_COMPANION:
        config = _state.config
        assert config is not None
        _state.pending.append(
            config.hook.pytest_report_to_serializable(config=config, report=report)
        )


def pytest_runtest_logfinish(nodeid, location):
    """In the companion: the test's reports, one line once it has ended
    (the main process reports a test whole, never half of one)."""
    if _IN_COMPANION:
        assert _state.folder is not None
        line = json.dumps({"nodeid": nodeid, "location": location, "reports": _state.pending})
        _state.pending.clear()
        with open(_state.folder / "reports", "a") as f:
            f.write(line + "\n")


def _forward(config) -> None:
    """Reports, as this process's, the tests the companion has ended since
    the last call."""
    assert _state.folder is not None
    with open(_state.folder / "reports", "rb") as f:
        f.seek(_state.read)
        chunk = f.read()
    chunk = chunk[: chunk.rfind(b"\n") + 1]  # whole lines only
    _state.read += len(chunk)
    for line in chunk.splitlines():
        test = json.loads(line)
        nodeid, location = test["nodeid"], tuple(test["location"])
        _state.reported.add(nodeid)
        config.hook.pytest_runtest_logstart(nodeid=nodeid, location=location)
        for data in test["reports"]:
            report = config.hook.pytest_report_from_serializable(config=config, data=data)
            config.hook.pytest_runtest_logreport(report=report)
        config.hook.pytest_runtest_logfinish(nodeid=nodeid, location=location)


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session):
    """In the main process, after its own tests: the companion's end, the
    rest of its reports, and a failure for each test it claimed and never
    reported."""
    result = yield
    proc = _state.proc
    if proc is None:
        return result
    assert _state.folder is not None
    try:
        code = proc.wait(END_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    _forward(session.config)
    ran_here = {n for n in _state.candidates if _state.owned.get(_module(n))}
    missing = sorted(_state.candidates - ran_here - _state.reported)
    if missing:
        log = (_state.folder / "log").read_text(errors="replace")
        hook = session.config.hook
        for nodeid in missing:
            location = (_module(nodeid), None, nodeid)
            why = f"the companion process (exit {code}) never ran this test; its output ends:\n"
            report = pytest.TestReport(nodeid, location, {}, "failed", why + log[-6000:], "call")
            hook.pytest_runtest_logstart(nodeid=nodeid, location=location)
            hook.pytest_runtest_logreport(report=report)
            hook.pytest_runtest_logfinish(nodeid=nodeid, location=location)
    return result


def pytest_unconfigure(config):
    """The companion stopped with the main process (an interrupted run),
    its folder removed."""
    if _IN_COMPANION:
        return
    if _state.proc is not None and _state.proc.poll() is None:
        _state.proc.kill()
        _state.proc.wait()
    if _state.folder is not None:
        shutil.rmtree(_state.folder, ignore_errors=True)
