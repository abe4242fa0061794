"""Holding an apply inside the engine's load for exactly as long as a test
needs: the fault file's "stall" (weights_backend.FAULT_FILE_ENV)."""

from __future__ import annotations

import time
from contextlib import contextmanager


@contextmanager
def stalled(fault_file):
    """Every load inside the block holds until the fault file is removed (or
    says something else); removed at the end whatever happens (entered last,
    so that nothing left waiting on the apply outlives the block)."""
    fault_file.write_text("stall")
    try:
        yield
    finally:
        fault_file.unlink(missing_ok=True)


def wait_stalled(fault_file, timeout: float = 60) -> None:
    """Until a load is held in the engine: the apply has begun."""
    deadline = time.monotonic() + timeout
    while fault_file.read_text() != "stalled":
        assert time.monotonic() < deadline, "the apply never reached the engine"
        time.sleep(0.02)
