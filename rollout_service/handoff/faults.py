"""Fault injection, for tests only: a file a test writes to make a running
server misbehave on purpose, so that what must catch the misbehaviour is
shown catching it.

A server started with ROLLOUT_SERVICE_FAULT_FILE set to a path reads the file
where a fault can strike; unset (always, outside tests), nothing reads any
file and no fault can be turned on: there is no flag, and a running server
cannot be given the variable. The server logs a warning at start when it is
set. What the file says, while it exists:

- a number (empty: 0): loading weights fails inside `load_weights` after that
  many tensors, the only way to exercise a failure half-way through a real
  load (worker/weights_backend.py);
- "stall": the load holds (the file is rewritten to "stalled" once it does)
  until the test changes or removes the file: an apply that lasts exactly as
  long as a test needs (worker/weights_backend.py);
- "stale-gate": the admission gate stamps each call with the version served
  before the last update, as if that update had not happened (engine/gate.py):
  the answer of a server whose update gate let calls through on the old
  weights, whose tokens a client then receives tagged older than an update it
  was acknowledged. The load test's watcher must fail the run on it
  (tests/engine/serving/test_load_locust.py).
"""

from __future__ import annotations

import os

FAULT_FILE_ENV = "ROLLOUT_SERVICE_FAULT_FILE"
STALL = "stall"
STALLED = "stalled"
STALE_GATE = "stale-gate"


def fault_file() -> str | None:
    """The fault file's path, if this process was started with one."""
    return os.environ.get(FAULT_FILE_ENV) or None


def read(path: str) -> str | None:
    """What the fault file says (None: no file, no fault)."""
    try:
        with open(path) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None
