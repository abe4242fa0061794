"""Running a script in the verl venv (tests/verl_env/build.py) and reading
what it saw: tests/engine/trainers/test_verl*.py drive verl's own code this
way. Each drive runs in a process started ahead, its imports done while the
drive before it ran (tests/verl_env/warm.py), the first one's while the
module before it runs. Each starts a Ray of its own, its session files in a
folder removed after the run and its token in the environment: nothing
under ~/.ray or /tmp/ray. (One cluster that every drive joined saved 4 s a
drive, but a drive on it hung once in nine runs, its calls never reaching
the service: not kept.)"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
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
# The folder of the drives' Ray files (a drive's session), removed at exit.
_ray_files: list[Path] = []
# Ray's token, in the environment of every drive: no file under ~/.ray.
RAY_ENV = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def _start(verl_python: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(verl_python), str(build.HERE / "warm.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **RAY_ENV},
    )


def _ray_folder() -> str:
    if not _ray_files:  # short: Ray's sockets live there
        _ray_files.append(Path(tempfile.mkdtemp(prefix="verl-ray-")))
    return str(_ray_files[0])


def _drives(item) -> bool:
    return getattr(getattr(item, "module", None), "verl_drive", None) is sys.modules[__name__]


def start_ahead_of(items) -> str | None:
    """The module that runs just before the first one that drives verl
    among `items` (in run order); `start_ahead` when it starts."""
    before = None
    for item in items:
        if _drives(item):
            return before
        before = item.nodeid.split("::")[0]
    return None


def start_ahead() -> None:
    """The first drive's process, started while the module before the
    first drive runs (about 5 s of imports the drive would wait for)."""
    if build.ready():
        with _taking:
            if not _warm:
                _warm.append(_start(build.python()))


def _take(verl_python: Path) -> subprocess.Popen[str]:
    """The process started ahead for this drive (or one started now), and
    the next drive's started."""
    with _taking:
        ahead = _warm.pop() if _warm else None
        _warm.append(_start(verl_python))
    return ahead if ahead is not None and ahead.poll() is None else _start(verl_python)


@atexit.register
def _stop() -> None:
    for proc in _warm:
        proc.kill()
        proc.wait()
    for folder in _ray_files:
        shutil.rmtree(folder, ignore_errors=True)


def drive(verl_python: Path, script: str, args: dict, timeout: float) -> dict:
    """Runs tests/verl_env/`script` with `args` (JSON on its stdin, which
    names the file it writes its answer to as "out", and "ray_files" the
    folder of its Ray session); returns that answer."""
    started = time.monotonic()
    proc = _take(verl_python)
    args = {**args, "ray_files": _ray_folder()}
    try:
        _, err = proc.communicate(f"{build.HERE / script}\n{json.dumps(args)}", timeout=timeout)
    except subprocess.TimeoutExpired:  # what it was doing when it hung
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"{script} ran over {timeout:.0f} s; its log ends:\n{err[-6000:]}")
    assert proc.returncode == 0, err[-6000:]
    print(f"{script}: {time.monotonic() - started:.0f} s")
    return json.loads(Path(args["out"]).read_text())
