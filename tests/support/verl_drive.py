"""Running a script in the verl venv (tests/verl_env/build.py) and reading
what it saw: tests/engine/trainers/test_verl*.py drive verl's own code this
way. Each drive runs in a process started ahead, its imports done while the
drive before it ran (tests/verl_env/warm.py), and joins the Ray cluster the
run's first drive started (tests/verl_env/ray_cluster.py), its files in a
folder of ours and its token in the environment (nothing under ~/.ray or
/tmp/ray), stopped and removed when the run ends."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import select
import shutil
import signal
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
# The run's Ray cluster: its process (holding it while its stdin is open),
# its folder, its log, and the address it printed once up.
_cluster: dict = {}
# The cluster's token, in the environment of every process that joins it.
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


def _start_cluster(verl_python: Path) -> None:
    """The run's Ray cluster, started once (its start overlaps the first
    drive's imports)."""
    if "proc" in _cluster:
        return
    folder = Path(tempfile.mkdtemp(prefix="verl-ray-"))  # short: Ray's sockets live there
    _cluster["folder"] = folder
    _cluster["log"] = open(folder / "cluster.log", "wb")
    _cluster["proc"] = subprocess.Popen(
        [str(verl_python), str(build.HERE / "ray_cluster.py"), str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=_cluster["log"],
        text=True,
        env={**os.environ, **RAY_ENV},
        start_new_session=True,  # Ray's processes in a group of their own: see _stop
    )


def _cluster_address(timeout: float = 120) -> str:
    """The address the cluster printed once up; a failure with its log if
    it exited or stayed silent."""
    if "address" not in _cluster:
        proc = _cluster["proc"]
        if select.select([proc.stdout], [], [], timeout)[0]:
            _cluster["address"] = proc.stdout.readline().strip()
        if not _cluster.get("address"):
            log = (_cluster["folder"] / "cluster.log").read_text(errors="replace")
            pytest.fail(f"the verl drives' Ray cluster did not start:\n{log[-4000:]}")
    return _cluster["address"]


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
    """The cluster and the first drive's process, started while the module
    before the first drive runs (about 5 s of imports and 3 s of Ray's start
    that the first drive would wait for)."""
    if build.ready():
        with _taking:
            _start_cluster(build.python())
            if not _warm:
                _warm.append(_start(build.python()))


def _take(verl_python: Path) -> subprocess.Popen[str]:
    """The process started ahead for this drive (or one started now), and
    the next drive's started."""
    with _taking:
        _start_cluster(verl_python)
        ahead = _warm.pop() if _warm else None
        _warm.append(_start(verl_python))
    return ahead if ahead is not None and ahead.poll() is None else _start(verl_python)


@atexit.register
def _stop() -> None:
    for proc in _warm:
        proc.kill()
        proc.wait()
    proc = _cluster.get("proc")
    if proc is not None:
        proc.stdin.close()  # its cue to stop Ray
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        # What outlived it (all of Ray's agents, had it been killed)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        _cluster["log"].close()
        shutil.rmtree(_cluster["folder"], ignore_errors=True)


def drive(verl_python: Path, script: str, args: dict, timeout: float) -> dict:
    """Runs tests/verl_env/`script` with `args` (JSON on its stdin, which
    names the file it writes its answer to as "out", and "ray" the cluster
    it joins); returns that answer."""
    started = time.monotonic()
    proc = _take(verl_python)
    args = {**args, "ray": _cluster_address()}
    try:
        _, err = proc.communicate(f"{build.HERE / script}\n{json.dumps(args)}", timeout=timeout)
    except subprocess.TimeoutExpired:  # what it was doing when it hung
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"{script} ran over {timeout:.0f} s; its log ends:\n{err[-6000:]}")
    assert proc.returncode == 0, err[-6000:]
    print(f"{script}: {time.monotonic() - started:.0f} s")
    return json.loads(Path(args["out"]).read_text())
