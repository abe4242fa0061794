"""Keeping the service's own processes off the cores vLLM's CPU worker computes on.

On a CPU host vLLM binds its worker's OpenMP threads to some cores
(``VLLM_CPU_OMP_THREADS_BIND``; by default it leaves one core per worker to
"the rest"), but binds nothing else. This server's event loop, its gRPC
threads and the engine-core process float over every core, and each time one
of them lands on a worker core it preempts the worker, which stalls the step
of every request in the batch. ``keep_off_worker_cores`` moves them onto the
cores no worker is bound to. On a GPU host no worker is bound and it changes
nothing. Linux only (``sched_setaffinity`` per thread).

What it is worth is measured against ``--no-cpu-placement`` in one run by
``python -m benchmarks.compare --only ours,floating`` (BENCHMARKS.md).
"""

from __future__ import annotations

import logging
import os

import psutil

log = logging.getLogger(__name__)


def _affinity(proc: psutil.Process) -> set[int] | None:
    try:
        return set(proc.cpu_affinity())
    except (psutil.Error, OSError):  # gone, or not ours
        return None


def pin_process(pid: int, cpus: set[int]) -> None:
    """Moves every thread of ``pid`` onto ``cpus``. Threads created later
    inherit their creator's mask, so each existing thread is moved (the
    process mask alone only moves the main thread)."""
    for thread in psutil.Process(pid).threads():
        try:
            os.sched_setaffinity(thread.id, cpus)
        except (ProcessLookupError, PermissionError):  # thread ended meanwhile
            pass


def keep_off_worker_cores(root_pid: int | None = None) -> tuple[set[int], set[int]] | None:
    """Moves ``root_pid`` (default: this process) and every unbound process
    under it onto the CPUs that no bound descendant (a vLLM worker) uses.

    Returns (worker CPUs, CPUs the rest now runs on), or None when nothing was
    moved: no bound worker (GPU host, ``VLLM_CPU_OMP_THREADS_BIND=nobind``) or
    no CPU left over for the rest.
    """
    root = psutil.Process(root_pid or os.getpid())
    allowed = _affinity(root)
    if not allowed:
        return None
    floating, worker_cpus = [root], set()
    for child in root.children(recursive=True):
        cpus = _affinity(child)
        if cpus is None:
            continue
        if cpus < allowed:
            worker_cpus |= cpus
        elif cpus == allowed:
            floating.append(child)
    rest = allowed - worker_cpus
    if not worker_cpus or not rest:
        return None
    for proc in floating:
        try:
            pin_process(proc.pid, rest)
        except psutil.NoSuchProcess:
            pass
    return worker_cpus, rest


def apply(enabled: bool) -> None:
    """The server's start-up step: place, and say what was done."""
    if not enabled:
        return
    placed = keep_off_worker_cores()
    if placed is None:
        log.info("CPU placement: no vLLM worker is bound to cores; nothing moved")
        return
    worker, rest = placed
    log.info(
        "CPU placement: vLLM worker on CPUs %s; this server and the engine core moved to %s "
        "(--no-cpu-placement keeps them floating)",
        sorted(worker),
        sorted(rest),
    )
