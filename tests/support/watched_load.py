"""One Locust run against the session server, watched: a Prometheus scrapes
the server's --metrics-port all along and a caller makes refused calls
beside the load. Two modules check the same run (conftest's `watched_load`,
made once a session): tests/engine/serving/test_load_locust.py the run's own
report (no failure, no stale token, every kind of call), and
tests/engine/serving/test_dashboard.py every panel's query. One run instead
of one each: a Locust run is its seconds of load on both cores."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness.serverproc import ServerProcess
from rollout_client import RolloutClient, RolloutError
from tests.support.load import Run, locust_cmd, read_stats, read_tokens
from tests.support.prometheus import SCRAPE_SECONDS, Prometheus

LOAD_SECONDS = 20


@dataclass(frozen=True)
class WatchedLoad:
    """The run: its Prometheus (running until the session ends), its window
    (`start`, `end`: epoch seconds, the last scrapes after the run included),
    Locust's exit status and output, its reports' paths (`prefix`: the CSV
    prefix), and the reasons the refused calls got."""

    prometheus: Prometheus
    start: float
    end: float
    returncode: int
    log: str
    prefix: Path
    html: Path
    refused: list[str]

    def stats(self) -> dict[tuple[str, str], dict[str, int]]:
        return read_stats(self.prefix)

    def tokens(self) -> dict[str, float]:
        return read_tokens(self.prefix)


def _refuse(target: str, rounds: int, every: float, done: list[str]) -> None:
    """`rounds` rounds `every` seconds apart, each a call on a weight version
    the server does not serve and one with a negative temperature (a counter's
    series appears at its first refusal; its rate shows from the second)."""
    with RolloutClient(target, timeout=60, retries=0) as c:
        for i in range(rounds):
            if i:
                time.sleep(every)
            for options in (
                {"required_weight_version": "not-served", "max_tokens": 2},
                {"temperature": -1.0, "max_tokens": 2},
            ):
                try:
                    c.generate(prompt_token_ids=[11, 12, 13], **options)
                except RolloutError as e:
                    done.append(e.reason)


@contextmanager
def run_watched(server: ServerProcess, out: Path) -> Iterator[WatchedLoad]:
    """The run, its reports written under `out`; Prometheus stops after the block."""
    # An engine compiles its logprobs kernel at the first request that asks
    # for logprobs (a session turn does): here, not in the run's seconds.
    with (
        RolloutClient(server.target, timeout=300) as c,
        c.open_session(prompt_token_ids=[11, 22, 33]) as session,
    ):
        session.generate(max_tokens=2)
    with Prometheus(f"127.0.0.1:{server.metrics_port}") as prometheus:
        prometheus.wait_scraped()
        prefix, html = out / "run", out / "report.html"
        args = ["--headless", "-u", "7", "-r", "7", "-t", f"{LOAD_SECONDS}s", "--only-summary"]
        args += ["--rollout-target", server.target, "--push-every", "3"]
        # The HTTP front's address puts the OpenAI agent in the mix.
        args += ["--rollout-http-url", f"http://{server.http_target}"]
        args += ["--pause-modes", "keep,wait", "--turns", "3", "--output-tokens", "16-32"]
        args += ["--csv", str(prefix), "--html", str(html)]
        start = time.time()
        refused: list[str] = []
        refusing = threading.Thread(target=_refuse, args=(server.target, 3, 6.0, refused))
        with Run(locust_cmd(args)) as load:
            refusing.start()
            load.wait(LOAD_SECONDS + 120)
            refusing.join(60)
        time.sleep(3 * SCRAPE_SECONDS)  # the last scrapes after the run
        assert load.returncode is not None
        yield WatchedLoad(
            prometheus, start, time.time(), load.returncode, load.log(), prefix, html, refused
        )
