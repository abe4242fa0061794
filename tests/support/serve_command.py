"""The `rollout-service serve` command run to its end, for configurations
refused at start (no engine is started for them).

Each such run would spend ~15 s importing vLLM before its refusal, so
`serve_each` runs several in one go and pays the import once: a runner process
(this file run as a script) imports what the command imports before it reads
its arguments, then forks once per run (as many at a time as it has CPUs).
Each fork is the command's process from there on: it sets the run's
environment and CPU affinity, writes its stdout and stderr to files of its
own, and executes the console script itself (.venv/bin/rollout-service, so
`rollout_service.cli:main` and `sys.exit(main())` as installed); the
interpreter turns its SystemExit into the exit status and finalizes, as in a
process of its own. Forks share nothing with each other (environment,
affinity, logging, vLLM's and the server's globals live and die with each),
and a run's output is what the runner printed while importing followed by
what its fork wrote: the stdout and stderr a process of its own would have.
The server module and its parent_watch (which records its importer's pid) are
imported by each fork, not by the runner.

A run still going after its timeout, or at the end of the runner's budget
(its refusal is gone, so an engine starts), gets SIGTERM, then SIGKILL with
every process under it, and reading its result raises
subprocess.TimeoutExpired, as subprocess.run would.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

SERVE = str(Path(sys.executable).with_name("rollout-service"))
# A fork's refusal takes ~5 s (its own imports, argument parsing, exit); this
# is for a run that was not refused.
RUN_TIMEOUT = 60.0
# The runner's whole time, imports included: a fixture calling serve_each
# ends within the suite's 240 s pytest-timeout (pyproject.toml), so a run that
# was not refused fails its own test, not every test of the fixture's module.
BUDGET = 180.0
# After SIGTERM, before SIGKILL (the server shuts a starting engine down cleanly).
STOP_GRACE = 10.0


@dataclass(frozen=True)
class Run:
    """`rollout-service serve --port 0 *args`, with these environment variables
    removed and, if given, its CPU affinity reduced to `cpus`."""

    args: tuple[str, ...]
    unset: tuple[str, ...] = ()
    cpus: frozenset[int] | None = None

    def argv(self) -> list[str]:
        return [SERVE, "serve", "--port", "0", *self.args]


class Outcomes(dict):
    """Each run's CompletedProcess; reading a run that timed out raises its
    subprocess.TimeoutExpired (as subprocess.run would have)."""

    def __getitem__(self, name):
        outcome = super().__getitem__(name)
        if isinstance(outcome, subprocess.TimeoutExpired):
            raise outcome
        return outcome


def serve_each(
    runs: Mapping[str, Run], timeout: float = RUN_TIMEOUT, budget: float = BUDGET
) -> Outcomes:
    """Every run's exit status and output, by name; vLLM imported once. A run
    times out after `timeout` s, or when the runner has run `budget` s."""
    if any("--log-json" in run.args for run in runs.values()):
        raise ValueError("the runner logs its imports as plain lines: no --log-json here")
    with tempfile.TemporaryDirectory(prefix="serve-each-") as tmp:
        d = Path(tmp)
        spec = {
            name: {
                "argv": run.argv(),
                "unset": list(run.unset),
                "cpus": None if run.cpus is None else sorted(run.cpus),
            }
            for name, run in runs.items()
        }
        (d / "runs.json").write_text(
            json.dumps({"timeout": timeout, "budget": budget, "runs": spec})
        )
        runner = subprocess.Popen(
            [sys.executable, __file__, tmp],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # Its own process group: the forks and anything they start are in
            # it, and go with it if it has to be killed.
            start_new_session=True,
        )
        try:
            out, err = runner.communicate(timeout=budget + STOP_GRACE + 30)
        finally:
            if runner.poll() is None:
                os.killpg(runner.pid, signal.SIGKILL)
                runner.communicate()
        if runner.returncode != 0:
            raise RuntimeError(f"serve_each's runner failed ({runner.returncode}):\n{out}\n{err}")
        codes = json.loads((d / "results.json").read_text())
        prelude_out, prelude_err = _read(d / "prelude.out"), _read(d / "prelude.err")
        outcomes = Outcomes()
        for i, (name, run) in enumerate(runs.items()):
            stdout = prelude_out + _read(d / f"{i}.out")
            stderr = prelude_err + _read(d / f"{i}.err")
            code, argv = codes[name], run.argv()
            if code is None:
                outcomes[name] = subprocess.TimeoutExpired(argv, timeout, stdout, stderr)
            else:
                outcomes[name] = subprocess.CompletedProcess(argv, code, stdout, stderr)
        return outcomes


def _read(path: Path) -> str:
    """A file's text; none for a run the budget left no time to start."""
    return path.read_text(errors="replace") if path.exists() else ""


# The runner: this file run as a script (above, only the standard library is
# imported, before sys.path[0] is made the console script's folder).


def _redirect(prefix: Path) -> None:
    """This process's stdout and stderr (fds 1 and 2) to prefix.out/.err."""
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, suffix in ((1, ".out"), (2, ".err")):
        f = os.open(f"{prefix}{suffix}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)


def _import_the_command(d: Path) -> None:
    """Imports what the command imports before it reads its arguments, in its
    order (logging is configured first), printing into prelude.out/.err."""
    saved = os.dup(1), os.dup(2)
    _redirect(d / "prelude")
    from rollout_service.ops import logs

    logs.configure(json_lines=False)
    import vllm.engine.arg_utils  # noqa: F401
    import vllm.utils.argparse_utils  # noqa: F401

    import rollout_service.cli  # noqa: F401

    sys.stdout.flush()
    sys.stderr.flush()
    for fd, copy in zip((1, 2), saved):
        os.dup2(copy, fd)
        os.close(copy)  # no fork inherits a copy of the pipes to serve_each
    # The server module (and parent_watch, which keeps its importer's pid) is
    # each fork's own import.
    assert "rollout_service.engine.parent_watch" not in sys.modules, "imported by the runner"


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@dataclass
class _Fork:
    name: str
    deadline: float
    # Once past the deadline: when SIGKILL follows the SIGTERM, and the
    # processes the fork had started.
    kill_at: float | None = None
    started: list = field(default_factory=list)

    def stop(self, pid: int, now: float) -> None:
        """SIGTERM (the server shuts a starting engine down cleanly), then
        SIGKILL; both once."""
        if self.kill_at is None:
            self.started = _descendants(pid)
            os.kill(pid, signal.SIGTERM)
            self.kill_at = now + STOP_GRACE
        elif now > self.kill_at:
            self.started += _descendants(pid)
            os.kill(pid, signal.SIGKILL)
            self.kill_at = float("inf")

    def reaped(self) -> None:
        """Ends what the fork had started, if still there."""
        for proc in self.started:
            try:
                proc.kill()
            except Exception:  # gone already
                pass


def _become(run: dict, prefix: Path) -> None:
    """In the fork: the run's process, up to executing the console script."""
    _redirect(prefix)
    for name in run["unset"]:
        os.environ.pop(name, None)
    if run["cpus"] is not None:
        # The fork's only thread; threads started later inherit it.
        os.sched_setaffinity(0, run["cpus"])
    sys.argv = list(run["argv"])


def _run_all(tmp: str) -> None:
    """Forks the runs, as many at a time as this process has CPUs, and writes
    their exit codes (None: timed out, or not run within the budget) to
    results.json."""
    end = time.monotonic()
    d = Path(tmp)
    spec = json.loads((d / "runs.json").read_text())
    end += spec["budget"]
    _import_the_command(d)
    waiting = list(enumerate(spec["runs"].items()))
    running: dict[int, _Fork] = {}
    codes: dict[str, int | None] = {name: None for name in spec["runs"]}
    while running or (waiting and time.monotonic() < end):
        while waiting and len(running) < len(os.sched_getaffinity(0)) and time.monotonic() < end:
            i, (name, run) = waiting.pop(0)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _become(run, d / str(i))
                # Nothing here catches its SystemExit (no try, no with): the
                # interpreter exits the fork with the command's status.
                runpy.run_path(SERVE, run_name="__main__")
                sys.exit(0)  # never reached (the script exits); never back into this loop
            running[pid] = _Fork(name, min(time.monotonic() + spec["timeout"], end))
        time.sleep(0.05)
        for pid, fork in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                del running[pid]
                fork.reaped()
                if fork.kill_at is None:
                    codes[fork.name] = os.waitstatus_to_exitcode(status)
            elif (now := time.monotonic()) > fork.deadline:
                fork.stop(pid, now)
    (d / "results.json").write_text(json.dumps(codes))


if __name__ == "__main__":
    # The console script's sys.path[0] is its folder, not this file's.
    sys.path[0] = os.path.dirname(SERVE)
    _run_all(sys.argv[1])
