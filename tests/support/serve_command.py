"""The `rollout-service serve` command run to its end, for configurations
refused at start (no engine is started for them).

Each such run would spend ~6 CPU-s importing vLLM before its refusal, so
`serve_each` runs them forked from the suite's forker, which has imported
the command once (tests/support/serve_forks.py), as many at a time as this
process has CPUs. Each run is the command's process from its fork on: its
environment (this process's, the test engine's settings, less `unset`) and
CPU affinity, its own stdout and stderr (first what the forker printed while
importing), and the installed console script's exit status.

A run still going after its timeout, or at the end of serve_each's budget
(its refusal is gone, so an engine starts), gets SIGTERM, then SIGKILL with
every process under it, and reading its result raises
subprocess.TimeoutExpired, as subprocess.run would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness.serverproc import TEST_ENGINE_ENV
from tests.support import forker, serve_forks

SERVE = forker.SERVE
# A fork's refusal takes ~5 s (its own imports, argument parsing, exit); this
# is for a run that was not refused.
RUN_TIMEOUT = 60.0
# serve_each's whole time: a fixture calling it ends within the suite's 240 s
# pytest-timeout (pyproject.toml), so a run that was not refused fails its
# own test, not every test of the fixture's module.
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
    times out after `timeout` s, or when serve_each has run `budget` s."""
    end = time.monotonic() + budget
    waiting = list(enumerate(runs.items()))
    running: dict[str, _Running] = {}
    outcomes: dict[str, subprocess.CompletedProcess[str] | subprocess.TimeoutExpired] = {}
    with tempfile.TemporaryDirectory(prefix="serve-each-") as tmp:
        while running or (waiting and time.monotonic() < end):
            while waiting and len(running) < len(os.sched_getaffinity(0)):
                if time.monotonic() > end:
                    break
                i, (name, run) = waiting.pop(0)
                running[name] = _Running(run, Path(tmp) / str(i), end, timeout)
            time.sleep(0.05)
            for name, r in list(running.items()):
                if (outcome := r.outcome()) is not None:
                    outcomes[name] = outcome
                    del running[name]
    for _, (name, run) in waiting:  # no time left to start them
        outcomes[name] = subprocess.TimeoutExpired(run.argv(), timeout, "", "")
    return Outcomes({name: outcomes[name] for name in runs})


class _Running:
    """One run, forked; stopped past its deadline."""

    def __init__(self, run: Run, prefix: Path, end: float, timeout: float) -> None:
        self.argv = run.argv()
        self.out, self.err = f"{prefix}.out", f"{prefix}.err"
        env = {k: v for k, v in {**os.environ, **TEST_ENGINE_ENV}.items() if k not in run.unset}
        cpus = None if run.cpus is None else sorted(run.cpus)
        self.proc = serve_forks.start(self.argv, env, self.out, self.err, cpus)
        self.timeout = timeout
        self.deadline = min(time.monotonic() + timeout, end)
        # Once past the deadline: when SIGKILL follows the SIGTERM, and the
        # processes the run had started.
        self.kill_at: float | None = None
        self.started: list[psutil.Process] = []

    def outcome(self) -> subprocess.CompletedProcess[str] | subprocess.TimeoutExpired | None:
        """The run's result once it has ended, else None (and a stop if due)."""
        code = self.proc.poll()
        if code is None:
            if (now := time.monotonic()) > self.deadline:
                self._stop(now)
            return None
        for proc in self.started:  # what it had started, if still there
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        stdout, stderr = _read(self.out), _read(self.err)
        if self.kill_at is not None:
            return subprocess.TimeoutExpired(self.argv, self.timeout, stdout, stderr)
        return subprocess.CompletedProcess(self.argv, code, stdout, stderr)

    def _stop(self, now: float) -> None:
        """SIGTERM (the server shuts a starting engine down cleanly), then
        SIGKILL; both once."""
        if self.kill_at is None:
            self.started = _descendants(self.proc.pid)
            self.proc.send_signal(signal.SIGTERM)
            self.kill_at = now + STOP_GRACE
        elif now > self.kill_at:
            self.started += _descendants(self.proc.pid)
            self.proc.send_signal(signal.SIGKILL)
            self.kill_at = float("inf")


def _read(path: str) -> str:
    return Path(path).read_text(errors="replace") if Path(path).exists() else ""


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
