"""vLLM's engine core exits without its interpreter's final collection.

The engine core is a spawned process: once vLLM has shut it down (its
worker stopped, its sockets and shared memory closed), multiprocessing's
`spawn_main` ends it with `sys.exit`, and the interpreter then collects the
whole heap vLLM, torch and transformers built, for the OS to free anyway.
Measured with py-spy on the embedded model: 2 of its 2.5 s between the
worker's exit and its own were that collection (the rest vLLM's own
`gc.collect`), and on a loaded host the whole took over 8 s, past the
server's wait for it (server.ENGINE_EXIT_SECONDS) before.

An engine core forked ahead (core_fork.py) ends through `end` directly.
So, in an engine process spawned under an armed server (the engine core when
it could not be forked ahead; a worker when the user asked for spawned
ones), spawn_main's `sys.exit` runs
the exit functions (log handlers flush) and then `os._exit`, as the server
itself ends (cli._exit), and as a forked process always ends. Everything
multiprocessing does at a process's end (its finalizers, joining threads)
has run by then; only that final collection and the module teardown are
skipped. Any other `sys.exit` in the process behaves as before.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import sys
from typing import Any, NoReturn

from rollout_service.engine import parent_watch

_SPAWN = "multiprocessing.spawn"


def in_spawned_child() -> None:
    """The plugin hook's part: in a process multiprocessing spawned under an
    armed server, spawn_main's exit skips the final collection; anywhere
    else (or a second time), nothing."""
    armed_by = os.environ.get(parent_watch.ENV)
    if not armed_by or armed_by == str(os.getpid()) or multiprocessing.parent_process() is None:
        return
    install()


def install() -> None:
    """Makes spawn_main's `sys.exit` end the process at once, after the exit
    functions (the module docstring); idempotent."""
    if getattr(sys.exit, "skips_final_collection", False):
        return
    real = sys.exit

    def exit(code: Any = None) -> None:
        caller = sys._getframe(1)
        if caller.f_code.co_name == "spawn_main" and caller.f_globals.get("__name__") == _SPAWN:
            end(code)
        real(code)

    exit.skips_final_collection = True  # type: ignore[attr-defined]
    sys.exit = exit  # type: ignore[assignment]


def end(code: Any) -> NoReturn:
    """Ends this process at once, its exit functions run (log handlers
    flush, OpenTelemetry exports its last spans) and its interpreter's
    finalization skipped (the module docstring)."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else int(code is not None))
