"""The servers every module may use (conftest.py's session fixtures), kept
as they were when they became ready: after each module, conftest's
`_left_clean` asks `left_behind` what the module left wrong on each one, and
weights it left are put back so that no module counts on another's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from harness.serverproc import ServerProcess
from rollout_client import RolloutClient
from tests.support.served_weights import (
    Fingerprint,
    fingerprint,
    restore,
    served_checkpoint,
    update_left_open,
)

log = logging.getLogger(__name__)


@dataclass
class Shared:
    """A server every module may use, as it was when it became ready: what a
    module must leave it as (`left_behind`)."""

    name: str
    proc: ServerProcess
    client_options: dict  # RolloutClient's: a token, TLS files
    start: Fingerprint = field(init=False)
    checkpoint: Path = field(init=False)
    fault_file: Path | None = None

    def __post_init__(self) -> None:
        with self.client() as c:
            self.start = fingerprint(c)
            self.checkpoint = served_checkpoint(c)

    def client(self, **kw) -> RolloutClient:
        return RolloutClient(self.proc.target, **{"timeout": 120, **self.client_options, **kw})


_shared: list[Shared] = []  # the shared servers started so far, while they run
# (module, server) whose weights were put back, for the run's summary.
restored: list[tuple[str, str]] = []


@contextmanager
def serving(name: str, proc: ServerProcess, client_options=None, fault_file=None) -> Iterator[None]:
    """`proc` once ready, shared (checked and restored after each module)
    while the block runs, stopped after it."""
    options = client_options or {}
    shared = None
    try:
        proc.wait_ready(**options)
        shared = Shared(name, proc, options, fault_file=fault_file)
        _shared.append(shared)
        yield
    finally:
        if shared in _shared:
            _shared.remove(shared)
        proc.stop(wait=False)


def left_behind(module: str) -> list[str]:
    """What `module` left wrong on each shared server still running, one
    entry per server; its weights restored where they were all that was
    wrong."""
    left = []
    for shared in list(_shared):
        if shared.proc.proc.poll() is None and (problems := _problems(shared, module)):
            left.append(f"the {shared.name} " + "; ".join(problems))
    return left


def _problems(shared: Shared, module: str) -> list[str]:
    """What a module left wrong on `shared`; its weights restored if they
    were all that was wrong."""
    with shared.client(timeout=30, retries=0) as c:
        deadline = time.monotonic() + 15
        while (info := c.server_info()).engine_requests and time.monotonic() < deadline:
            time.sleep(0.1)
        fault_file = shared.fault_file
        problems = [
            what
            for what, bad in (
                ("degraded (an update failed inside the engine)", info.degraded),
                ("asleep", info.sleeping),
                (f"{info.engine_requests} engine requests still running", info.engine_requests),
                (
                    "its fault file in place (the next update would fail)",
                    fault_file is not None and fault_file.exists(),
                ),
            )
            if bad
        ]
        if problems:
            return problems
        if (why := update_left_open(c)) is not None:
            return [f"holding a staged update open (a new one is refused: {why})"]
        now = fingerprint(c)
    if now.matches(shared.start):
        return []
    log.info("restoring the %s's weights: %s (started on %s)", shared.name, now, shared.start)
    try:
        with shared.client(timeout=120) as c:
            restore(c, shared.start, shared.checkpoint)
            now = fingerprint(c)
    except Exception as e:  # whatever it is, this module's report says it
        return [f"on other weights ({now}); restoring {shared.checkpoint} failed: {e!r}"]
    restored.append((module, shared.name))
    if not now.matches(shared.start):
        return [f"on other weights, not its own after a restore: {now}, not {shared.start}"]
    return []
