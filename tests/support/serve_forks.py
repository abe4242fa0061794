"""The suite's `rollout-service serve` processes, forked from one that has
imported the command once.

A start spends about 6 of its 13 CPU-s importing vLLM before the command
reads its arguments, and the suite starts about thirty servers. So
ServerProcess launches through `launch` here (tests/conftest.py sets it): a
forker (this file run as a script, started at the first launch) imports what
the command imports before it reads its arguments, in its order, then forks
once per server (and per run of tests.support.serve_command). Each
fork is the command's process from there on, as a process of its own would
be: the caller's environment, stdin /dev/null, stdout and stderr
the server's log (what the forker printed while importing first, as the
command prints it), and the installed console script run as `__main__`
(`sys.exit(main())`). The server module and parent_watch (which keeps its
importer's pid) are each fork's own imports.

A command that might not be what it is as a process of its own, forked, is
started as one (the fork executes it): one whose environment differs from the
forker's in a variable that could be read at an import the forker made (the
engine core's forked-ahead rule, rollout_service.engine.core_fork.unexplained,
with the suite's variables read on use, `SUITE_ON_USE`; one the imports set,
given the value they set, is no difference), or one that logs JSON lines (the
import's lines are plain). A fork's environment is the caller's with what the
imports changed as they left it.

`start` returns at once (the forker may still be importing): its `Started`
stands for the process as a Popen does (pid, poll, wait, send_signal,
terminate, kill, returncode, and `forked`); the forker reports each one's exit
status. The forker ends with the suite (its stdin closes), after SIGTERM to a
server still running (none when every fixture stopped its own).
"""

from __future__ import annotations

import json
import os
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any, NoReturn

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
# How long a launch waits for the forker to answer (its imports first).
ANSWER_SECONDS = 300.0
# After the suite ends, what a server still running gets before SIGKILL.
STOP_GRACE = 30.0


class Started:
    """A command the forker started, as subprocess.Popen stands for its child."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.returncode: int | None = None
        self._pid: int | None = None
        # Started, or else (with why not) executed as a process of its own.
        self.forked: bool | None = None
        self.not_forked: list[str] = []
        self._started = threading.Event()
        self._ended = threading.Event()

    @property
    def pid(self) -> int:
        if not self._started.wait(ANSWER_SECONDS) or self._pid is None:
            raise RuntimeError(f"the forker did not start {self.args}: {_forker.tail()}")
        return self._pid

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # ended; its status on its way
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _end(self, code: int) -> None:
        self.returncode = code
        self._started.set()
        self._ended.set()


class _Forker:
    """The forker process and the launches waiting for its answers."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._waiting: list[Started] = []  # launched, in order, not yet given a pid
        self._running: dict[int, Started] = {}
        self._errors = tempfile.TemporaryFile()

    def fork(self, request: dict) -> Started:
        """`request` (argv, env, out, err, cpus) forked; at once."""
        with self._lock:
            if self.proc is None:
                self._start()
            started = Started(request["argv"])
            self._waiting.append(started)
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        return started

    def _start(self) -> None:
        from harness.serverproc import TEST_ENGINE_ENV

        env = {**os.environ, **TEST_ENGINE_ENV}
        self.proc = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            env=env,
        )
        threading.Thread(target=self._read, name="serve-forks", daemon=True).start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            answer = json.loads(line)
            with self._lock:
                if "started" in answer:
                    started = self._waiting.pop(0)
                    started._pid = answer["started"]
                    started.not_forked = answer["not_forked"]
                    started.forked = not started.not_forked
                    self._running[started._pid] = started
                    started._started.set()
                    how = (
                        "forked"
                        if started.forked
                        else "not forked: " + ", ".join(started.not_forked)
                    )
                    counts[how] = counts.get(how, 0) + 1
                else:
                    self._running.pop(answer["ended"])._end(answer["code"])
        # The forker is gone: what it had not answered for never will be.
        with self._lock:
            for started in [*self._waiting, *self._running.values()]:
                started._end(255)
            self._waiting.clear()
            self._running.clear()

    def tail(self) -> str:
        self._errors.seek(0)
        return self._errors.read().decode(errors="replace")[-4000:]


_forker = _Forker()


# How many commands were forked, and why the others were not (the suite's summary).
counts: dict[str, int] = {}


def start(
    cmd: list[str], env: dict[str, str], out: str, err: str, cpus: list[int] | None = None
) -> Started:
    """`cmd` with stdout and stderr appended to the files `out` and `err`
    (which may be one) and its CPU affinity `cpus` if given."""
    return _forker.fork({"argv": cmd, "env": env, "out": out, "err": err, "cpus": cpus})


def launch(cmd: list[str], *, stdout: IO[Any], stderr: int, env: dict[str, str]) -> Started:
    """ServerProcess's launch (subprocess.Popen as LoggedServer calls it)."""
    assert stderr == subprocess.STDOUT, "a server's log has both"
    return start(cmd, env, stdout.name, stdout.name)


# The forker: this file run as a script (above, only the standard library is
# imported at the top, before sys.path[0] is made the console script's folder).


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
        self.changed = {
            k
            for k in initial.keys() | self.imported.keys()
            if initial.get(k) != self.imported.get(k)
        }

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
        why = [k for k in unexplained(self.initial, env) if k not in SUITE_ON_USE | as_imported]
        # Otherwise what the imports read or changed, and Inductor's (set in
        # its config only in the engine core forked ahead), must be as they were.
        changed = {k for k in env.keys() | self.initial.keys() if env.get(k) != self.initial.get(k)}
        return why + sorted(changed & (self.changed | set(INDUCTOR)) - set(why) - as_imported)

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
