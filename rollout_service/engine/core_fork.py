"""vLLM's engine core starts as a fork of this server, taken before its
threads, instead of a fresh interpreter.

On a CPU host vLLM spawns its engine core: a new interpreter that imports
torch, transformers and vLLM again, which this server has just done. A fork
shares what is imported. Measured on the embedded model (benchmarks/startup.py,
BENCHMARKS.md): SERVING in 11.7 s instead of 18.7, 12.8 CPU-seconds instead of
20.6 (the engine core's 1.6 instead of 8.8).

It cannot fork when vLLM asks for the engine core: by then gRPC's threads run,
and a fork copies a process mid-flight. So `fork_ahead` forks a child right
after the server's first steps, while this process has one thread; the child
imports the rest of the engine core's modules and waits on a pipe. When vLLM
starts its engine core, the process object it would have pickled for the
spawned interpreter goes down that pipe instead, and the child runs it as the
spawned one would (`multiprocessing.spawn._main`'s steps). It is this server's
child: vLLM sees a process it can poll, join and signal as before.

The child was copied before vLLM set its engine's environment, and a few
settings are read when a module is imported, not when used. So at the launch
the child first gets the environment and compares it with its own, variable by
variable (`unexplained`): one read on use (vLLM's and ours, ON_USE) is just
set; torch Inductor's two, read at its import, are set in its config as the
import would have; one read at the import of a module the child has not
imported is set for that import; a preloaded library (LD_PRELOAD) is fine when
the child has it mapped already (vLLM preloads torch's own libgomp, which
torch loaded). Anything else, or an engine core whose arguments carry file
descriptors, and the child is sent away: vLLM spawns its engine core as
before. A second engine core (data parallelism) is always spawned, and so is
every engine process when the server's environment has
VLLM_WORKER_MULTIPROC_METHOD=spawn (worker_fork.py). Only on a CPU host: on
the others vLLM chooses between fork and spawn itself, left as it is.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import signal
import struct
import sys
import threading
import traceback
from dataclasses import dataclass
from multiprocessing import popen_fork, process, reduction, spawn, util
from multiprocessing.context import SpawnContext, SpawnProcess, set_spawning_popen
from multiprocessing.util import close_fds as _close  # type: ignore[attr-defined]
from typing import NoReturn

from rollout_service.engine import vllm_compat, worker_fork

log = logging.getLogger(__name__)

# What the child imports while it waits: the engine core's own modules, which
# this server does not import (most of what they need, it has).
PRELOAD = ("vllm.v1.engine.core", "vllm.v1.executor.multiproc_executor")
# Read on use, never at an import: set in the child like any variable.
ON_USE = frozenset(
    {
        "ROLLOUT_SERVICE_FORK_WORKERS",
        "ROLLOUT_SERVICE_SERVER_PID",
        "VLLM_CPU_KVCACHE_SPACE",
        "VLLM_CPU_OMP_THREADS_BIND",
        "VLLM_DISABLE_SHARED_EXPERTS_STREAM",
        "VLLM_SSM_CONV_STATE_LAYOUT",
        "VLLM_USE_AOT_COMPILE",
        "VLLM_WORKER_MULTIPROC_METHOD",
        "LOCAL_WORLD_SIZE",
        "OTEL_SERVICE_NAME",
    }
)
# Read by torch Inductor's config at its import (torch/_inductor/config.py).
INDUCTOR = ("TORCHINDUCTOR_COMPILE_THREADS", "TORCHINDUCTOR_CPP_DYNAMIC_THREADS")
# Read at the import of a module (not one this server imports): vLLM's CPU
# platform sets the first, its ROCm operations the AITER ones.
READ_AT_IMPORT = {
    "NUMEXPR_MAX_THREADS": "numexpr",
    "AITER_SITUV2_A4W4": "aiter",
    "AITER_SITUV2_A8W4": "aiter",
}
TITLE = "rollout-service engine core (forked ahead)"
_LENGTH = struct.Struct("!Q")


@dataclass
class _Ahead:
    """The forked child, waiting."""

    pid: int
    launch: int  # to the child: the environment, then the process object
    answers: int  # from the child: what in the environment it cannot take
    ended: int  # readable once the child (and what it forked) has exited

    def takes(self, environ: dict[str, str]) -> list[str]:
        """Sends the environment and this thread's signal mask (a child keeps
        the mask of the thread that starts it: startup.py blocks SIGINT for
        the engine's processes); the variables the child cannot take (none:
        it waits for the process object)."""
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
        try:
            _send(self.launch, pickle.dumps((environ, mask)))
            answer = _receive(self.answers)
        except OSError:  # it died
            answer = None
        return ["(the child is gone)"] if answer is None else pickle.loads(answer)

    def send_away(self) -> None:
        """Closes the pipes (the child exits when it reads its end) and reaps
        the child without waiting for it here."""
        _close(self.launch, self.answers, self.ended)
        threading.Thread(target=_reap, args=(self.pid,), daemon=True).start()


_ahead: _Ahead | None = None


def fork_ahead(cpu_host: bool) -> bool:
    """Called by the server once its environment for the engine is set and
    before it starts any thread: on a CPU host, forks the child vLLM's engine
    core will start from. Whether it did (not with a second thread running,
    nor where vLLM's engine core could not be given to it)."""
    global _ahead
    # Elsewhere vLLM forks its engine core itself unless CUDA (or the like)
    # is initialised; not run here, so left as vLLM does it.
    if not cpu_host:
        return False
    # The user's way to have every engine process spawned (worker_fork.py too).
    if os.environ.get(worker_fork.VLLM_METHOD) == "spawn":
        return False
    if _ahead is not None or threading.active_count() > 1 or not hasattr(os, "fork"):
        return False
    if not vllm_compat.choose_engine_core_context(_context):
        return False
    # A spawned child shares this process's resource tracker: so does this one.
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    launch_r, launch_w = os.pipe()
    answers_r, answers_w = os.pipe()
    ended_r, ended_w = os.pipe()
    # Forked with SIGINT blocked: a thread an at-fork hook starts in the child
    # keeps it blocked, as the engine's processes have it (`takes`).
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    util._flush_std_streams()  # type: ignore[attr-defined]  # or the child writes them again
    try:
        pid = os.fork()
    except OSError as e:  # no memory or processes left for it: vLLM spawns
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        _close(launch_r, launch_w, answers_r, answers_w, ended_r, ended_w)
        log.info("engine core not forked ahead: %s", e)
        return False
    if pid == 0:  # pragma: no cover - the child; tests see what it runs
        try:  # never back into the server's code, whatever happens
            _close(launch_w, answers_r, ended_r)
            _wait_and_run(launch_r, answers_w)  # keeps ended_w open until it exits
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(1)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    _close(launch_r, answers_w, ended_w)
    _ahead = _Ahead(pid, launch_w, answers_r, ended_r)
    return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _send(fd: int, data: bytes) -> None:
    with open(fd, "wb", closefd=False) as f:
        f.write(_LENGTH.pack(len(data)) + data)


def _receive(fd: int) -> bytes | None:
    """One message; None at the end of the pipe. Unbuffered: nothing of the
    next message is read with it."""
    head = _read(fd, _LENGTH.size)
    return None if head is None else _read(fd, _LENGTH.unpack(head)[0])


def _read(fd: int, n: int) -> bytes | None:
    """Exactly `n` bytes; None if the pipe ends first."""
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _context(context):
    """vLLM's multiprocessing context for its engine core, or one whose
    processes start from the child when it can take them."""
    if _ahead is None:
        return context
    if context.get_start_method() != "spawn":
        _ahead.send_away()  # vLLM forks on its own: nothing to save
        _take()
        return context
    return _FROM_AHEAD


def _take() -> _Ahead | None:
    global _ahead
    ahead, _ahead = _ahead, None
    return ahead


class _NeedsDescriptors(Exception):
    """Pickling the process object asked to pass a file descriptor."""


class _Probe:
    """Stands for the Popen while the process object is pickled, as spawn's
    does: objects that may only go to a new process check one is there."""

    def duplicate_for_child(self, fd: int) -> int:
        raise _NeedsDescriptors

    DupFd = duplicate_for_child


def _pickled(process_obj) -> bytes | None:
    """The preparation data and the process object, as spawn would send
    them; None when that needs a file descriptor passed."""
    buffer = io.BytesIO()
    set_spawning_popen(_Probe())  # type: ignore[arg-type]
    try:
        reduction.dump(spawn.get_preparation_data(process_obj._name), buffer)
        reduction.dump(process_obj, buffer)
    except _NeedsDescriptors:
        return None
    finally:
        set_spawning_popen(None)
    return buffer.getvalue()


def unexplained(at_fork: dict[str, str], now: dict[str, str]) -> list[str]:
    """The variables that changed since the fork and that this process (the
    child) cannot take as a spawned interpreter would (the module docstring)."""
    changed = [k for k in at_fork.keys() | now.keys() if at_fork.get(k) != now.get(k)]
    return sorted(
        k
        for k in changed
        if k not in ON_USE
        and k not in INDUCTOR
        and not (k in READ_AT_IMPORT and READ_AT_IMPORT[k] not in sys.modules)
        and not (k == "LD_PRELOAD" and _preloaded_already(at_fork.get(k, ""), now.get(k, "")))
    )


def _preloaded_already(before: str, after: str) -> bool:
    """Whether an LD_PRELOAD changed from `before` to `after` changes nothing
    here: it keeps every library of before (those stay loaded) and every one
    it adds is mapped in this process already."""
    old, new = _libraries(before), _libraries(after)
    with open("/proc/self/maps") as f:
        mapped = {os.path.realpath(line.split(maxsplit=5)[-1].strip()) for line in f if "/" in line}
    return old <= new and all(p in mapped for p in new - old)


def _libraries(preload: str) -> set[str]:
    return {os.path.realpath(p) for p in preload.replace(" ", ":").split(":") if p}


class _FromAhead(SpawnProcess):
    @staticmethod
    def _Popen(process_obj):
        ahead = _take()
        if ahead is not None:
            payload = _pickled(process_obj)
            if payload is None:
                refused = ["(file descriptors in its arguments)"]
            elif not (refused := ahead.takes(dict(os.environ))):
                try:
                    _send(ahead.launch, payload)
                    return _Popen(process_obj, ahead)
                except OSError:  # it died after answering
                    refused = ["(the child is gone)"]
            log.info("engine core spawned, not forked: it would differ in %s", ", ".join(refused))
            ahead.send_away()
        return SpawnProcess._Popen(process_obj)


class _FromAheadContext(SpawnContext):
    Process = _FromAhead


_FROM_AHEAD = _FromAheadContext()


class _Popen(popen_fork.Popen):
    """A forked process's Popen whose fork happened ahead (and whose process
    object the child has been sent)."""

    def __init__(self, process_obj, ahead: _Ahead) -> None:
        self._ahead = ahead
        super().__init__(process_obj)

    def _launch(self, process_obj) -> None:
        ahead = self._ahead
        self.pid = ahead.pid
        self.sentinel = ahead.ended
        os.close(ahead.answers)
        # The write end stays open: it is the child's parent sentinel, as
        # spawn's is.
        self.finalizer = util.Finalize(self, _close, (ahead.ended, ahead.launch))


def _wait_and_run(launch: int, answers: int) -> NoReturn:  # pragma: no cover - in the child
    """The child: imports, waits for the environment and the process object,
    runs it, exits."""
    # A Ctrl-C is the server's to handle: it ends this child by closing the pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    try:
        import setproctitle

        setproctitle.setproctitle(TITLE)
    except ImportError:
        pass
    for module in PRELOAD if "vllm" in sys.modules else ():
        try:
            __import__(module)
        except Exception:  # the engine core imports it again and says why
            pass
    message = _receive(launch)
    if message is None:
        os._exit(0)
    environ, mask = pickle.loads(message)
    refused = unexplained(dict(os.environ), environ)
    _send(answers, pickle.dumps(refused))
    os.close(answers)
    payload = None if refused else _receive(launch)
    if payload is None:
        os._exit(0)
    os.environ.clear()
    os.environ.update(environ)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from rollout_service.engine import quick_exit

    quick_exit.end(_run(payload, launch))


def _run(payload: bytes, parent_sentinel: int) -> int:  # pragma: no cover - in the child
    """What `multiprocessing.spawn._main` does with what it reads, in this copy."""
    _as_fresh()
    _set_inductor(os.environ)
    buffer = io.BytesIO(payload)
    spawn.prepare(pickle.load(buffer))
    # vLLM runs its plugins once per process; this copy inherited the flag.
    plugins = sys.modules.get("vllm.plugins")
    if plugins is not None:
        plugins.plugins_loaded = False  # type: ignore[attr-defined]
    current = process.current_process()
    current._inheriting = True  # type: ignore[attr-defined]
    try:
        process_obj = pickle.load(buffer)
    finally:
        del current._inheriting  # type: ignore[attr-defined]
    return process_obj._bootstrap(parent_sentinel=parent_sentinel)


def _as_fresh() -> None:  # pragma: no cover - in the child
    """What a fresh interpreter has and this copy of the server does not: no
    current event loop, and the root logger as Python starts it (the
    server's log format is its own; vLLM's loggers are set up alike in
    every process)."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is not None:
        asyncio.set_event_loop_policy(None)
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(logging.WARNING)


def _set_inductor(environ) -> None:  # pragma: no cover - in the child
    """torch Inductor's settings read at its import, as the import would
    have read them in this environment."""
    config = sys.modules.get("torch._inductor.config")
    if config is None:
        return
    config.compile_threads = config.decide_compile_threads()  # type: ignore[attr-defined]
    config.cpp.dynamic_threads = environ.get(INDUCTOR[1], "0") == "1"
