"""The suite's `rollout-service serve` processes, forked from one that has
imported the command once.

A start spends about 6 of its 13 CPU-s importing vLLM before the command
reads its arguments, and the suite starts about thirty servers. So
ServerProcess launches through `launch` here (tests/conftest.py sets it): a
forker (this file run as a script, started at the first launch) imports what
the command imports before it reads its arguments, in its order (as
tests.support.serve_command's runner does), then forks once per server. Each
fork is the command's process from there on, as a process of its own would
be: the caller's environment (set in full), stdin /dev/null, stdout and stderr
the server's log (what the forker printed while importing first, as the
command prints it), and the installed console script run as `__main__`
(`sys.exit(main())`). The server module and parent_watch (which keeps its
importer's pid) are each fork's own imports.

A server whose environment differs from the forker's in a variable not known
to be read on use (`ON_USE`: the engine core's forked-ahead list and the
suite's own) could differ from a process of its own, and one that logs JSON
lines would get the import's lines in plain text: those start with
subprocess.Popen, as every server did before.

`launch` returns at once (the forker may still be importing): its `Forked`
stands for the process as a Popen does (pid, poll, wait, send_signal,
terminate, kill, returncode); the forker reports each fork's exit status.
The forker ends with the suite (its stdin closes), after SIGTERM to a server
still running (none when every fixture stopped its own).
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
from typing import IO, Any

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


class Forked:
    """A server forked by the forker, as subprocess.Popen stands for its child."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.returncode: int | None = None
        self._pid: int | None = None
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
        self._environ: dict[str, str] | None = None
        self._lock = threading.Lock()
        self._waiting: list[Forked] = []  # launched, in order, not yet given a pid
        self._running: dict[int, Forked] = {}
        self._errors = tempfile.TemporaryFile()

    def fork(self, request: dict) -> Forked:
        """`request` (argv, env, out, err, cpus) forked; at once."""
        with self._lock:
            if self.proc is None:
                self._start()
            forked = Forked(request["argv"])
            self._waiting.append(forked)
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        return forked

    @property
    def environ(self) -> dict[str, str]:
        """The forker's environment: this process's at the first call, with
        the test engine's settings."""
        if self._environ is None:
            from harness.serverproc import TEST_ENGINE_ENV

            self._environ = {**os.environ, **TEST_ENGINE_ENV}
        return self._environ

    def _start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            env=self.environ,
        )
        threading.Thread(target=self._read, name="serve-forks", daemon=True).start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            answer = json.loads(line)
            with self._lock:
                if "started" in answer:
                    forked = self._waiting.pop(0)
                    forked._pid = answer["started"]
                    self._running[forked._pid] = forked
                    forked._started.set()
                else:
                    self._running.pop(answer["ended"])._end(answer["code"])
        # The forker is gone: what it had not answered for never will be.
        with self._lock:
            for forked in [*self._waiting, *self._running.values()]:
                forked._end(255)
            self._waiting.clear()
            self._running.clear()

    def tail(self) -> str:
        self._errors.seek(0)
        return self._errors.read().decode(errors="replace")[-4000:]


_forker = _Forker()


def forkable(cmd: list[str], env: dict[str, str]) -> bool:
    """Whether the command, forked, is what it would be as a process of its
    own: `rollout-service serve` with no JSON logs, its environment the
    forker's but for variables read on use."""
    return not _differences(cmd, env)


def _differences(cmd: list[str], env: dict[str, str]) -> list[str]:
    """What keeps the command from being forked (none: it can be)."""
    from rollout_service.engine.core_fork import ON_USE

    if cmd[:2] != [SERVE, "serve"]:
        return [cmd[0]]
    if "--log-json" in cmd:
        return ["--log-json"]
    base = _forker.environ
    changed = {k for k in env.keys() | base.keys() if env.get(k) != base.get(k)}
    return sorted(changed - ON_USE - SUITE_ON_USE)


# How many servers were forked, and why the others were not (the suite's summary).
counts: dict[str, int] = {}


def start(
    cmd: list[str], env: dict[str, str], out: str, err: str, cpus: list[int] | None = None
) -> Forked | subprocess.Popen[bytes]:
    """`cmd` with stdout and stderr appended to the files `out` and `err`
    (which may be one) and its CPU affinity `cpus` if given: forked when it
    can be (`forkable`), else run by subprocess.Popen."""
    differences = _differences(cmd, env)
    reason = "forked" if not differences else "not forked: " + ", ".join(differences)
    counts[reason] = counts.get(reason, 0) + 1
    if not differences:
        return _forker.fork({"argv": cmd, "env": env, "out": out, "err": err, "cpus": cpus})
    with open(out, "ab") as o, open(err, "ab") as e:
        return subprocess.Popen(
            cmd,
            stdout=o,
            stderr=subprocess.STDOUT if err == out else e,
            env=env,
            preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
        )


def launch(
    cmd: list[str], *, stdout: IO[Any], stderr: int, env: dict[str, str]
) -> Forked | subprocess.Popen[bytes]:
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


def _become(request: dict, printed: tuple[bytes, bytes], own: list[int]) -> None:
    """In the fork: the command's process, up to running the console script."""
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
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    # As `ps` shows a process of its own (its interpreter, the script's path).
    import setproctitle

    setproctitle.setproctitle(" ".join([sys.executable, *sys.argv]))


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
    """Forks a server for each request line on stdin, answers its pid, then
    its exit status once it ends; at stdin's end, stops what still runs."""
    printed = _import_the_command()
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
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _become(request, printed, list(children))
                    # Nothing here catches its SystemExit (no try, no with):
                    # the interpreter exits the fork with the command's status.
                    runpy.run_path(SERVE, run_name="__main__")
                    sys.exit(0)  # never reached (the script exits); never back into this loop
                children[os.pidfd_open(pid)] = pid
                _answer({"started": pid})


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
