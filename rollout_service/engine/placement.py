"""Keeping the service's own processes off the cores vLLM's CPU worker computes on.

On a CPU host vLLM binds its worker's OpenMP threads to some cores
(``VLLM_CPU_OMP_THREADS_BIND``; by default it leaves one core per worker to
"the rest"), but binds nothing else. This server's event loop, its gRPC
threads and the engine-core process float over every core, and each time one
of them lands on a worker core it preempts the worker, which stalls the step
of every request in the batch. ``keep_off_worker_cores`` moves them onto the
cores no worker is bound to. On a GPU host no worker is bound and it changes
nothing. Linux only (``sched_setaffinity`` per thread).

Several CPU workers (``--tensor-parallel-size 2``): vLLM's automatic binding
gives each worker a NUMA node of its own, and on a machine with fewer nodes
than workers (one socket: most machines) the engine dies at start with a
traceback ("Not enough allowed NUMA nodes"). ``bind_cpu_workers`` sets the
variable instead, before the engine starts, from ``worker_binding``: each
worker gets its own share of the allowed CPUs; with fewer CPUs than workers
the start is refused, naming the variable.

What it is worth is measured against ``--no-cpu-placement`` in one run by
``python -m benchmarks.compare --only ours,floating`` (BENCHMARKS.md).
"""

from __future__ import annotations

import logging
import os

import psutil

log = logging.getLogger(__name__)

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


class PlacementError(Exception):
    """The CPU workers cannot have a core each: the start is refused."""


def worker_binding(workers: int, cpus: list[int], numa_nodes: int) -> str | None:
    """A ``VLLM_CPU_OMP_THREADS_BIND`` value (one CPU list per worker, ``|``
    between them) giving each of ``workers`` CPU workers its own ``cpus``, or
    None when vLLM's automatic binding works (one worker, or a NUMA node each).

    The CPUs are split into equal contiguous shares, one per worker; with two
    or more a share, its last CPU is left to this server and the engine core,
    as vLLM's automatic binding leaves one core per worker. SMT siblings are
    not told apart. Raises PlacementError with fewer CPUs than workers.
    """
    if workers <= 1 or numa_nodes >= workers:
        return None
    if len(cpus) < workers:
        raise PlacementError(
            f"{workers} CPU workers need a CPU each to bind their threads to, and this "
            f"process may use {len(cpus)} CPU(s) ({','.join(map(str, cpus))}) on "
            f"{numa_nodes} NUMA node(s); allow more CPUs, lower --tensor-parallel-size, or "
            f"set {BIND_ENV} yourself (a CPU list per worker, e.g. '0|1')"
        )
    cpus = sorted(cpus)
    share = len(cpus) // workers
    lists = [cpus[i * share : (i + 1) * share] for i in range(workers)]
    if share > 1:
        lists = [cpu_list[:-1] for cpu_list in lists]
    return "|".join(",".join(map(str, cpu_list)) for cpu_list in lists)


def bind_cpu_workers(engine_args) -> str | None:
    """The server's first start-up step on a CPU host: sets
    ``VLLM_CPU_OMP_THREADS_BIND`` for the engine when it is unset and vLLM's
    own binding would fail; returns the value set. A value already set is the
    user's and is left alone. Raises PlacementError."""
    from vllm.platforms import current_platform

    if BIND_ENV in os.environ or not current_platform.is_cpu():
        return None
    # The NUMA nodes vLLM's automatic binding counts.
    from vllm.utils.cpu_resource_utils import get_visible_memory_node

    workers = (engine_args.tensor_parallel_size or 1) * (engine_args.pipeline_parallel_size or 1)
    nodes = len(get_visible_memory_node())
    value = worker_binding(workers, sorted(os.sched_getaffinity(0)), nodes)
    if value is not None:
        os.environ[BIND_ENV] = value
        log.info(
            "CPU placement: %d CPU workers on %d NUMA node(s): %s=%r (vLLM's automatic "
            "binding needs a NUMA node per worker)",
            workers,
            nodes,
            BIND_ENV,
            value,
        )
    return value


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
        log.info(
            "CPU placement: nothing moved: no vLLM worker is bound to some of the cores, "
            "or the workers take every core"
        )
        return
    worker, rest = placed
    log.info(
        "CPU placement: vLLM worker on CPUs %s; this server and the engine core moved to %s "
        "(--no-cpu-placement keeps them floating)",
        sorted(worker),
        sorted(rest),
    )
