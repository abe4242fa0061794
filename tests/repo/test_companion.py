"""The suite's companion process (tests/support/companion.py), on a suite of
its own in a temporary folder: the engine-free modules are shared between
two processes, and the run reports every test of both as one run, failures
and their messages included; a test the companion claimed and never ran
fails the run, with the companion's output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CONFTEST = """
import pytest

pytest_plugins = ["tests.support.companion"]


def pytest_configure(config):
    config.addinivalue_line("markers", "engine: needs an engine")


def pytest_collection_modifyitems(items):
    for item in items:
        if "engine" in item.nodeid:
            item.add_marker(pytest.mark.engine)
"""

# Records which process ran it (a file per test, named by the test).
RECORD = """
import os
from pathlib import Path


def record(name):
    Path(os.environ["PIDS"], name).write_text(str(os.getpid()))
"""

# The first module holds the main process until the companion has claimed
# the next one (or 60 s have passed): the second module runs there.
FIRST = """
import time
from pathlib import Path

from record import record
from tests.support import companion


def test_first():
    claims = companion.shared_folder() / "claims"
    deadline = time.monotonic() + 60
    while len(list(claims.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    record("first")
"""

ENGINE = """
from record import record


def test_engine():
    record("engine")
"""


def _run(tmp_path: Path, second: str) -> tuple[subprocess.CompletedProcess[str], dict[str, int]]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "record.py").write_text(RECORD)
    (tmp_path / "test_a_first.py").write_text(FIRST)
    (tmp_path / "test_b_second.py").write_text(second)
    (tmp_path / "test_c_engine.py").write_text(ENGINE)
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}", "PIDS": str(pids)}
    env.pop("ROLLOUT_TESTS_COMPANION", None)  # this run's main process is not one
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "."],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    return done, {p.name: int(p.read_text()) for p in pids.iterdir()}


def test_a_companion_runs_a_module_and_its_reports_are_the_runs(tmp_path):
    second = """
from record import record


def test_second_passes():
    record("second")


def test_second_fails():
    assert 1 + 1 == 3, "failed where the companion ran it"
"""
    done, pids = _run(tmp_path, second)
    out = done.stdout
    assert done.returncode == 1, out[-3000:]
    assert "1 failed, 3 passed" in out, out[-3000:]
    assert "failed where the companion ran it" in out and "test_second_fails" in out
    # The main process ran the first module and the engine test; the
    # companion the second module.
    assert pids["first"] == pids["engine"] != pids["second"], pids


def test_a_test_the_companion_never_ran_fails_the_run(tmp_path):
    second = """
import os


def test_second_dies():
    if os.environ.get("ROLLOUT_TESTS_COMPANION"):
        os._exit(3)
"""
    done, pids = _run(tmp_path, second)
    out = done.stdout
    assert done.returncode == 1, out[-3000:]
    assert "1 failed, 2 passed" in out, out[-3000:]
    assert "the companion process (exit 3) never ran this test" in out, out[-3000:]
