"""vLLM's engine core forks its workers instead of spawning them.

vLLM's CPU platform sets VLLM_WORKER_MULTIPROC_METHOD=spawn while it builds
the engine's config, in this server, before the engine core starts; the
engine core inherits it, so each worker starts a fresh interpreter that
imports vLLM, torch and transformers again. Here that import is a quarter
of a server's start: measured on the embedded model, ready in 46 s and 57
CPU-seconds spawned, 24 s and 31 CPU-seconds forked.

A forked worker starts from the engine core's memory, where all of it is
already imported. Fork is vLLM's own default for workers on its other
platforms, and it is safe at that point: the engine core creates its
workers first thing (EngineCore.__init__ builds the executor right after
loading plugins), before it runs any torch operation, so no OpenMP thread
pool exists yet to be copied half-made.

One thing a fork loses: vLLM binds a CPU worker to its cores only through
the environment of the process it starts, which the OpenMP runtime reads
when it loads, and in a fork it loaded long before. So the forked worker
applies that binding itself, first thing: its CPUs (every thread it starts
later inherits them) and its thread count. Its threads then stay on its
cores, as spawned; they are not pinned one per core within them (that
needs OpenMP's own binding: VLLM_WORKER_MULTIPROC_METHOD=spawn in the
server's environment keeps spawned workers, at the cost above).

The engine core itself is not forked when vLLM starts it (this server runs
gRPC's threads by then, which a fork would copy mid-flight): it starts from a
copy of this server forked before them (core_fork.py).
"""

from __future__ import annotations

import multiprocessing
import os

from rollout_service.engine import vllm_compat

# Set by arm() in the server; the engine core inherits it.
ENV = "ROLLOUT_SERVICE_FORK_WORKERS"
VLLM_METHOD = "VLLM_WORKER_MULTIPROC_METHOD"
_hooked = False


def arm() -> None:
    """Called once by the server before the engine starts (before vLLM's
    config overwrites VLLM_WORKER_MULTIPROC_METHOD): unless the user asked
    for spawn, the engine core will fork its workers."""
    if os.environ.get(VLLM_METHOD) != "spawn":
        os.environ[ENV] = "1"


def in_engine_process() -> None:
    """The plugin hook's part: in a process multiprocessing started under an
    armed server (the engine core; a spawned worker starts no processes),
    processes started from here on are forked, and bind themselves as vLLM
    asked. Anywhere else, nothing."""
    global _hooked
    if os.environ.get(ENV) != "1" or multiprocessing.parent_process() is None:
        return
    os.environ[VLLM_METHOD] = "fork"
    if not _hooked:
        _hooked = True
        os.register_at_fork(after_in_child=_bind_as_asked)


def _bind_as_asked() -> None:
    """In a forked child: the CPUs and threads vLLM set in the environment
    for the worker it is starting (none set: nothing to do)."""
    binding = vllm_compat.omp_binding(os.environ)
    if binding is None:
        return
    cpus, threads = binding
    # Every thread: another at-fork hook may have started one already (the
    # parent watch's, registered first in an engine core forked ahead).
    for task in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(task), cpus)
    if threads > 0:
        import torch

        torch.set_num_threads(threads)
