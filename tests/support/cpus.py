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


def vllm_process(root: psutil.Process, title: str) -> psutil.Process:
    """The one process under `root` whose title starts with `title`
    ("VLLM::Worker", "VLLM::EngineCore")."""
    found = [p for p in root.children(recursive=True) if " ".join(p.cmdline()).startswith(title)]
    assert len(found) == 1, [p.cmdline() for p in root.children(recursive=True)]
    return found[0]
