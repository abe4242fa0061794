"""The suite's `rollout-service serve` processes, forked from one that has
imported the command once.

A start spends about 6 of its 13 CPU-s importing vLLM before the command
reads its arguments, and the suite starts about thirty servers. So
ServerProcess launches through `launch` here (tests/conftest.py sets it): a
forker (tests/support/forker.py, started at the first launch) imports what
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
with the suite's variables read on use, `forker.SUITE_ON_USE`; one the
imports set, given the value they set, is no difference), or one that logs
JSON lines (the import's lines are plain). A fork's environment is the caller's with what the
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
import signal
import subprocess
import sys
import tempfile
import threading
from typing import IO, Any

from tests.support import forker

# How long a launch waits for the forker to answer (its imports first).
ANSWER_SECONDS = 300.0


class Started:
    """A command the forker started, as subprocess.Popen stands for its child."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.returncode: int | None = None
        self._pid: int | None = None
        # Why it was executed as a process of its own (none: it was forked).
        self.not_forked: list[str] = []
        self._started = threading.Event()
        self._ended = threading.Event()

    @property
    def pid(self) -> int:
        if not self._started.wait(ANSWER_SECONDS) or self._pid is None:
            raise RuntimeError(f"the forker did not start {self.args}: {_forker.tail()}")
        return self._pid

    @property
    def forked(self) -> bool:
        """Whether it was forked (once started: waits as `pid` does)."""
        return bool(self.pid) and not self.not_forked

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
            [sys.executable, forker.__file__],
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
                    self._running[started._pid] = started
                    started._started.set()
                    why = ", ".join(started.not_forked)
                    how = f"not forked: {why}" if why else "forked"
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
