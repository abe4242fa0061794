"""vLLM's engine processes end when their parent dies.

The engine core is a child of this server and its workers are children of the
engine core. A server killed outright (SIGKILL, the OOM killer, a crash) cannot
shut them down, and vLLM does not notice on its own: the engine core waits on
its sockets for good, and a worker's death pipe only closes its queues. Seen
here: minutes after a SIGKILL of the server, engine core and worker were still
running and holding 2.6 GB.

So each of them watches its parent from a daemon thread that blocks on a pidfd
of the parent (readable once the parent has exited). It then sends itself
SIGTERM, which vLLM handles as an orderly shutdown (the engine core stops its
workers), and calls os._exit if still alive GRACE_SECONDS later (a main thread
stuck in C code never runs Python's signal handler). PR_SET_PDEATHSIG is not
used: it fires when the *thread* that forked the child exits, and the server
builds its engine inside asyncio.to_thread.

How the watcher gets into those processes: vLLM forks them by default
(VLLM_WORKER_MULTIPROC_METHOD=fork), and a forked child inherits vLLM's
"plugins already loaded" flag, so the `vllm.general_plugins` hook does NOT run
again in it; an at-fork hook does, and the engine core inherits the hook, so
it runs in its workers as well. With spawn (which vLLM forces in some cases,
e.g. CUDA already initialised) each child runs the plugin hook, which calls
`start_in_spawned_child`. Both are armed only by `arm()`, which the server
calls, so other programs that load this package as a vLLM plugin keep vLLM's
own behaviour.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import select
import signal
import threading
import time

log = logging.getLogger(__name__)

# Set by arm() to the server's pid; spawned children inherit it.
ENV = "ROLLOUT_SERVICE_SERVER_PID"
# Time between the SIGTERM and os._exit. vLLM's engine core waits up to 5 s
# (VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS) for its workers; those watch the
# engine core in turn, so everything is gone within about twice this.
GRACE_SECONDS = 5.0

# The pid of the process this module's memory belongs to: a forked child
# reads its parent's pid here before updating it (os.getppid() would already
# name init if the parent died before the child ran).
_pid = os.getpid()
# The pid that has a watcher thread (a forked child inherits the variable, not
# the thread, and vLLM may call the plugin hook more than once).
_watching: int | None = None
_armed = False


def arm() -> None:
    """Makes every process this one starts (and their children) watch its
    parent. Called once by the server, before the engine starts."""
    os.environ[ENV] = str(os.getpid())
    _hook_forks()


def start_in_spawned_child() -> None:
    """The plugin hook's part: in a process that multiprocessing spawned
    under an armed server, watch the parent (and arm the processes it forks).
    Anywhere else, nothing."""
    armed_by = os.environ.get(ENV)
    parent = multiprocessing.parent_process()
    if armed_by and armed_by != str(os.getpid()) and parent is not None and parent.pid:
        _start(parent.pid)
        _hook_forks()


def _hook_forks() -> None:
    global _armed
    if not _armed:  # the hook is inherited by forked children, and stays
        _armed = True
        os.register_at_fork(after_in_child=_after_fork)


def _after_fork() -> None:
    global _pid
    parent, _pid = _pid, os.getpid()
    _start(parent)


def _start(parent: int) -> None:
    global _watching
    if _watching == os.getpid():
        return
    _watching = os.getpid()
    threading.Thread(
        target=_watch, args=(parent,), name="rollout-parent-watch", daemon=True
    ).start()


def _watch(parent: int) -> None:
    wait_for_exit(parent)
    log.warning(
        "parent process %d is gone: pid %d shuts down (SIGTERM, exit in %.0fs at the latest)",
        parent,
        os.getpid(),
        GRACE_SECONDS,
    )
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_SECONDS)
    os._exit(1)


def wait_for_exit(pid: int) -> None:
    """Returns once process `pid`, this process's parent, has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfd (not Linux, or before 5.3)
        while os.getppid() == pid:
            time.sleep(0.5)
        return
    try:
        # The parent may have died, and its pid been reused, before the pidfd
        # was opened: then this process was already reparented.
        if os.getppid() != pid:
            return
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll()
    finally:
        os.close(fd)
