"""A process for tests/unit/server/test_quick_exit.py to spawn: it arms
rollout_service.engine.quick_exit as the plugin hook does in vLLM's engine
core, then leaves files saying what ran at its exit."""

from __future__ import annotations

import atexit
import gc
import os
import sys
from pathlib import Path


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    os.write(fd, text.encode())
    os.close(fd)


class _Cycle:
    """Freed only by a collection (it refers to itself); says so when it is."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.me = self

    def __del__(self, write=_write) -> None:  # bound now: modules may be gone at exit
        write(self.path, "collected")


def child(folder: str, code: int) -> None:
    from rollout_service.engine import quick_exit

    quick_exit.in_spawned_child()
    gc.disable()  # the cycle waits for the interpreter's final collection
    atexit.register(_write, str(Path(folder, "atexit")), "ran")
    _Cycle(str(Path(folder, "collected")))
    try:
        sys.exit(7)  # any other sys.exit still raises
    except SystemExit as e:
        _write(str(Path(folder, "caught")), str(e.code))
    raise SystemExit(code)
