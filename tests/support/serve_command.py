"""The `rollout-service serve` command run to its end, for configurations
refused at start (no engine is started for them). Each run is ~8-10 s of
imports before the refusal: `begin` starts runs in the background (before
the tests that check them, tests/support/early.py) and `serve` collects them."""

from __future__ import annotations

import atexit
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

SERVE = str(Path(sys.executable).with_name("rollout-service"))
TIMEOUT = 120

# Runs begun, by their arguments, until `serve` collects them.
_begun: dict[tuple[str, ...], tuple[subprocess.Popen, IO[bytes], IO[bytes]]] = {}


def _command(args: tuple[str, ...]) -> list[str]:
    return [SERVE, "serve", "--port", "0", *args]


def begin(*args: str) -> None:
    """Starts `serve(*args)` now; the next `serve(*args)` waits for it."""
    if args in _begun:
        return
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    _begun[args] = (subprocess.Popen(_command(args), stdout=out, stderr=err), out, err)


def serve(*args: str) -> subprocess.CompletedProcess:
    begun = _begun.pop(args, None)
    if begun is None:
        return subprocess.run(_command(args), capture_output=True, text=True, timeout=TIMEOUT)
    proc, out, err = begun
    with out, err:
        try:
            proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode(errors="replace"))
    return subprocess.CompletedProcess(proc.args, proc.returncode, *texts)


@atexit.register
def abandon() -> None:
    """Ends the runs begun and never collected (a run stopped early)."""
    while _begun:
        _, (proc, out, err) = _begun.popitem()
        proc.kill()
        proc.wait()
        out.close()
        err.close()
