"""Running a script in the verl venv (tests/verl_env/build.py) and reading
what it saw: tests/engine/trainers/test_verl.py and
tests/engine/trainers/test_verl_async.py drive verl's own code this way."""

from __future__ import annotations

import json
import subprocess
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


def drive(verl_python: Path, script: str, args: dict, timeout: float) -> dict:
    """Runs tests/verl_env/`script` with `args` (JSON on its stdin, which
    names the file it writes its answer to as "out"); returns that answer."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            [str(verl_python), str(build.HERE / script)],
            input=json.dumps(args),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:  # what it was doing when it hung
        tail = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
        pytest.fail(f"{script} ran over {timeout:.0f} s; its log ends:\n{(tail or '')[-6000:]}")
    assert done.returncode == 0, done.stderr[-6000:]
    print(f"{script}: {time.monotonic() - started:.0f} s")
    return json.loads(Path(args["out"]).read_text())
