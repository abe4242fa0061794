"""The forker of tests/support/serve_forks.py, run as a script: imports what
`rollout-service serve` imports before it reads its arguments, then starts a
command for each request line on stdin, forked or executed (`_Environ` says
which), answers its pid on stdout, then its exit status once it ends. Above
the script's part only the standard library is imported (serve_forks imports
this module for its path), before sys.path[0] is made the console script's
folder."""

from __future__ import annotations

import json
import os
import runpy
import select
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

SERVE = str(Path(sys.executable).with_name("rollout-service"))
# Read inside functions, never at an import (each checked where it is read).
SUITE_ON_USE = frozenset(
    {
        "ROLLOUT_SERVICE_FAULT_FILE",  # handoff.faults.fault_file()
        "ROLLOUT_SERVICE_CACHE",  # engine.tiny_models' cache folder
        "OTEL_BSP_SCHEDULE_DELAY",  # OpenTelemetry's BatchSpanProcessor()
        "PYTEST_CURRENT_TEST",  # pytest's, during each test; read by nothing the server runs
    }
)
# After the suite ends, what a server still running gets before SIGKILL.
STOP_GRACE = 30.0


def _import_the_command() -> tuple[bytes, bytes]:
    """Imports what the command imports before it reads its arguments, in its
    order (logging is configured first); what that printed to stdout and
    stderr."""
    saved = os.dup(1), os.dup(2)
    printed = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    for fd, f in zip((1, 2), printed):
        os.dup2(f.fileno(), fd)
    from rollout_service.ops import logs

    logs.configure(json_lines=False)
    import vllm.engine.arg_utils  # noqa: F401
    import vllm.utils.argparse_utils  # noqa: F401

    import rollout_service.cli  # noqa: F401

    sys.stdout.flush()
    sys.stderr.flush()
    for fd, copy in zip((1, 2), saved):
        os.dup2(copy, fd)
        os.close(copy)
    assert "rollout_service.engine.parent_watch" not in sys.modules, "imported by the forker"
    # Process titles (vLLM's "VLLM::EngineCore", the fork's command below)
    # are written over the area of argv and the environment, which
    # setproctitle finds at its first call: before a fork changes its
    # environment (after, it finds none and titles nothing).
    import setproctitle

    setproctitle.getproctitle()
    texts = []
    for f in printed:
        f.seek(0)
        texts.append(f.read())
        f.close()
    return texts[0], texts[1]


class _Environ:
    """The forker's environment: as it started, and what the command's
    imports changed in it (vLLM's cv2 sets LD_LIBRARY_PATH, torch Inductor
    its cache folder, ...)."""

    def __init__(self, initial: dict[str, str]) -> None:
        self.initial = initial
        self.imported = dict(os.environ)
        self.changed = _differing(initial, self.imported)

    def not_forked(self, request: dict) -> list[str]:
        """Why the request's command, forked, might not be what it is as a
        process of its own (none: it is what it would be)."""
        from rollout_service.engine.core_fork import INDUCTOR, unexplained

        argv, env = request["argv"], request["env"]
        if argv[:2] != [SERVE, "serve"]:
            return [argv[0]]
        if "--log-json" in argv:
            return ["--log-json"]
        # A variable the imports set, given the value they set (this process
        # imported what they import and inherited it): the fork's is that
        # value too, and the process a user starts has neither (the fork is
        # closer to it: LD_LIBRARY_PATH, which vLLM's cv2 sets, was not in
        # its loader's path at its start).
        as_imported = {k for k in self.changed if env.get(k) == self.imported.get(k)}
        # Otherwise: what the engine core's rule cannot explain (less the
        # suite's variables read on use), and any change to what the imports
        # changed or to Inductor's (set in its config only in the engine core
        # forked ahead).
        suspect = set(unexplained(self.initial, env)) - SUITE_ON_USE
        suspect |= _differing(self.initial, env) & (self.changed | set(INDUCTOR))
        return sorted(suspect - as_imported)

    def of(self, request: dict) -> dict[str, str]:
        """A forked command's environment: the request's, with what the
        imports changed as they left it (as they would have in a process of
        its own)."""
        env = dict(request["env"])
        for k in self.changed:
            if k in self.imported:
                env[k] = self.imported[k]
            else:
                env.pop(k, None)
        return env


def _differing(a: dict[str, str], b: dict[str, str]) -> set[str]:
    return {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}


def _become(request: dict, printed: tuple[bytes, bytes], own: list[int]) -> None:
    """In the child: the command's stdin (none), stdout, stderr (first what
    `printed` says) and CPUs."""
    out = os.open(request["out"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    err = (
        out
        if request["err"] == request["out"]
        else os.open(request["err"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    )
    null = os.open(os.devnull, os.O_RDONLY)
    os.write(out, printed[0])
    os.write(err, printed[1])
    for fd, to in ((0, null), (1, out), (2, err)):
        os.dup2(to, fd)
    for fd in {null, out, err, *own}:
        os.close(fd)
    if request["cpus"] is not None:
        # The fork's only thread; threads started later inherit it.
        os.sched_setaffinity(0, request["cpus"])


def _as_the_command(request: dict, environ: dict[str, str]) -> None:
    """In a fork: the command's environment, arguments and title."""
    os.environ.clear()
    os.environ.update(environ)
    sys.argv = list(request["argv"])
    # As `ps` shows a process of its own (its interpreter, the script's path).
    import setproctitle

    setproctitle.setproctitle(" ".join([sys.executable, *sys.argv]))


def _execute(request: dict) -> NoReturn:
    """In the child: the command, as a process of its own."""
    try:
        os.execve(request["argv"][0], request["argv"], request["env"])
    finally:  # never back into the forker's loop
        os._exit(127)


def _lines(fd: int, pending: bytearray) -> list[bytes] | None:
    """The whole lines now readable on `fd`; None at its end."""
    chunk = os.read(fd, 1 << 16)
    if not chunk:
        return None
    pending += chunk
    *lines, rest = bytes(pending).split(b"\n")
    pending[:] = rest
    return lines


def _answer(answer: dict) -> None:
    os.write(1, json.dumps(answer).encode() + b"\n")


def _fork_all() -> None:
    """Starts a command for each request line on stdin (forked, or executed
    as a process of its own), answers its pid, then its exit status once it
    ends; at stdin's end, stops what still runs."""
    initial = dict(os.environ)
    printed = _import_the_command()
    environ = _Environ(initial)
    children: dict[int, int] = {}  # pidfd: pid
    pending = bytearray()
    while True:
        ready, _, _ = select.select([0, *children], [], [])
        for fd in ready:
            if fd != 0:
                pid = children.pop(fd)
                _, status = os.waitpid(pid, 0)
                os.close(fd)
                _answer({"ended": pid, "code": os.waitstatus_to_exitcode(status)})
                continue
            lines = _lines(0, pending)
            if lines is None:
                _stop(children)
                return
            for line in lines:
                request = json.loads(line)
                not_forked = environ.not_forked(request)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _become(request, (b"", b"") if not_forked else printed, list(children))
                    if not_forked:
                        _execute(request)
                    _as_the_command(request, environ.of(request))
                    # Nothing here catches its SystemExit (no try, no with):
                    # the interpreter exits the fork with the command's status.
                    runpy.run_path(SERVE, run_name="__main__")
                    sys.exit(0)  # never reached (the script exits); never back into this loop
                children[os.pidfd_open(pid)] = pid
                _answer({"started": pid, "not_forked": not_forked})


def _stop(children: dict[int, int]) -> None:
    """SIGTERM to every server still running, SIGKILL past STOP_GRACE."""
    for pid in children.values():
        os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + STOP_GRACE
    while children and (left := end - time.monotonic()) > 0:
        for fd in select.select(list(children), [], [], left)[0]:
            os.waitpid(children.pop(fd), 0)
            os.close(fd)
    for pid in children.values():
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


if __name__ == "__main__":
    # The console script's sys.path[0] is its folder, not this file's.
    sys.path[0] = os.path.dirname(SERVE)
    _fork_all()
