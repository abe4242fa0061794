"""Which CPUs a process's threads may run on."""

from __future__ import annotations

import os

import psutil


def thread_cpus(proc: psutil.Process) -> set[int]:
    """The union of every thread's CPU mask."""
    cpus: set[int] = set()
    for t in proc.threads():
        cpus |= os.sched_getaffinity(t.id)
    return cpus
