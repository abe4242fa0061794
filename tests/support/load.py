"""Running the Locust load test (rollout_client.load) as a subprocess, and
reading what it wrote: Locust's CSV stats and our `<prefix>_tokens.csv`.

Never imports Locust: importing it patches the process for gevent."""

from __future__ import annotations

import csv
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

WORKER_LINE = re.compile(r"rollout-load worker: (\d+) requests")


def locust_cmd(args: list[str]) -> list[str]:
    """`python -m rollout_client.load ARGS`: how the docs run it."""
    return [sys.executable, "-m", "rollout_client.load", *args]


def read_stats(prefix: Path) -> dict[tuple[str, str], dict[str, int]]:
    """Locust's `<prefix>_stats.csv`: requests and failures by (type, name)."""
    with open(f"{prefix}_stats.csv", newline="") as f:
        return {
            (row["Type"], row["Name"]): {
                "requests": int(row["Request Count"]),
                "failures": int(row["Failure Count"]),
            }
            for row in csv.DictReader(f)
        }


def read_tokens(prefix: Path) -> dict[str, float]:
    """The load test's `<prefix>_tokens.csv` (one row)."""
    with open(f"{prefix}_tokens.csv", newline="") as f:
        (row,) = csv.DictReader(f)
    return {k: float(v) for k, v in row.items()}


class Run:
    """A Locust process with its output in a file; stopped (SIGINT, then
    killed past a deadline) when the block ends, if it is still running."""

    def __init__(self, cmd: list[str]) -> None:
        self._out = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT)
        self.returncode: int | None = None

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.returncode = self.proc.returncode

    def wait(self, timeout: float) -> int:
        self.returncode = self.proc.wait(timeout)
        return self.returncode

    def log(self) -> str:
        self._out.seek(0)
        return self._out.read().decode(errors="replace")

    def worker_requests(self) -> int:
        """The requests a worker made, from the line it logs when it quits."""
        m = WORKER_LINE.search(self.log())
        assert m, self.log()[-3000:]
        return int(m.group(1))

    def fetch(self, url: str, timeout: float = 60) -> str:
        """The page at `url`, once the process serves it."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    return r.read().decode()
            except (urllib.error.URLError, ConnectionError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"no page at {url}:\n{self.log()[-3000:]}") from None
                time.sleep(0.3)
