"""Running a script in the verl venv (tests/verl_env/build.py) and reading
what it saw: tests/engine/trainers/test_verl*.py drive verl's own code this
way. Each drive runs in a process started ahead, its imports done while the
drive before it ran (tests/verl_env/warm.py)."""

from __future__ import annotations

import atexit
import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.verl_env import build


def python() -> Path:
    """The verl venv's python; a failure, not a skip, when it is missing."""
    if not build.ready():
        pytest.fail(
            f"the verl venv {build.venv_path()} is missing or incomplete: "
            "run scripts/setup --dev (or python3 tests/verl_env/build.py)",
            pytrace=False,
        )
    return build.python()


_warm: list[subprocess.Popen[str]] = []  # the next drive's process, importing
_taking = threading.Lock()


def _start(verl_python: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(verl_python), str(build.HERE / "warm.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _take(verl_python: Path) -> subprocess.Popen[str]:
    """The process started ahead for this drive (or one started now), and
    the next drive's started."""
    with _taking:
        ahead = _warm.pop() if _warm else None
        _warm.append(_start(verl_python))
    return ahead if ahead is not None and ahead.poll() is None else _start(verl_python)


@atexit.register
def _stop_unused() -> None:
    for proc in _warm:
        proc.kill()
        proc.wait()


def drive(verl_python: Path, script: str, args: dict, timeout: float) -> dict:
    """Runs tests/verl_env/`script` with `args` (JSON on its stdin, which
    names the file it writes its answer to as "out"); returns that answer."""
    started = time.monotonic()
    proc = _take(verl_python)
    try:
        _, err = proc.communicate(f"{build.HERE / script}\n{json.dumps(args)}", timeout=timeout)
    except subprocess.TimeoutExpired:  # what it was doing when it hung
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"{script} ran over {timeout:.0f} s; its log ends:\n{err[-6000:]}")
    assert proc.returncode == 0, err[-6000:]
    print(f"{script}: {time.monotonic() - started:.0f} s")
    return json.loads(Path(args["out"]).read_text())
