"""The staging region: a POSIX shared-memory segment that holds an update's
bytes between the gRPC stream and the vLLM workers.

It is kept and reused between updates: writing into already-touched memory
runs at memcpy speed, while a fresh segment pays a page fault per page (about
ten times slower on these machines). It grows when an update needs more.
"""

from __future__ import annotations

import glob
import logging
import os
from multiprocessing import shared_memory

log = logging.getLogger(__name__)

# Segment names start with this, then the server's pid: a later start can
# tell a crashed run's leftovers from a live server's.
PREFIX = "rollout-staging-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_segments() -> list[str]:
    """Unlinks staging segments whose server process is gone."""
    removed = []
    for path in glob.glob(f"/dev/shm/{PREFIX}*"):
        try:
            pid = int(os.path.basename(path)[len(PREFIX) :].split("-")[0])
        except ValueError:
            continue
        if not _pid_alive(pid):
            try:
                os.unlink(path)
                removed.append(path)
            except FileNotFoundError:
                pass
    if removed:
        log.info("removed %d stale staging segment(s): %s", len(removed), removed)
    return removed


class StagingRegion:
    """A reusable shared-memory segment."""

    def __init__(self) -> None:
        self._shm: shared_memory.SharedMemory | None = None
        self._generation = 0

    @property
    def name(self) -> str:
        assert self._shm is not None
        return self._shm.name

    @property
    def size(self) -> int:
        return 0 if self._shm is None else self._shm.size

    def ensure(self, nbytes: int, prefault: bool = False) -> memoryview:
        """Returns a writable view of at least `nbytes`, growing the segment
        (a new one) when it is too small."""
        if self._shm is None or self._shm.size < nbytes:
            self.close()
            self._generation += 1
            name = f"{PREFIX}{os.getpid()}-{self._generation}"
            self._shm = shared_memory.SharedMemory(name=name, create=True, size=max(nbytes, 1))
            if prefault:
                # Touch every page now, so the first update writes at memcpy speed.
                _touch(self._shm.buf)
        return self._shm.buf

    def close(self) -> None:
        if self._shm is not None:
            self._shm.close()
            try:
                self._shm.unlink()
            except FileNotFoundError:
                pass
            self._shm = None


def _touch(buf: memoryview, step: int = 1 << 24) -> None:
    zeros = bytes(min(step, len(buf)))
    for start in range(0, len(buf), step):
        end = min(start + step, len(buf))
        buf[start:end] = zeros[: end - start]
