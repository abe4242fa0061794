"""A real Prometheus (Debian's package: scripts/setup-prometheus) scraping a
server's --metrics-port every second, and its HTTP API's queries; and the
Grafana dashboard's panel queries as Grafana would send them
(deploy/grafana/rollout-service.json)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.serverproc import free_port

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "rollout-service.json"
SCRAPE_SECONDS = 1
# What Grafana puts for its variables: `$__rate_interval` is four scrape
# intervals at least (Grafana's rule, with the data source's scrape interval
# set to the real one), `$instance` its "All" value, `$__range` the range
# shown (`range_seconds`, the whole run here).
RATE_INTERVAL = f"{4 * SCRAPE_SECONDS}s"

CONFIG = """\
global:
  scrape_interval: {every}s
  evaluation_interval: {every}s
scrape_configs:
  - job_name: rollout
    static_configs:
      - targets: ["{target}"]
"""


@dataclass(frozen=True)
class Target:
    """One query of one panel."""

    panel: str
    ref: str
    expr: str  # as written in the dashboard, with Grafana's variables


def panel_targets(dashboard: dict) -> list[Target]:
    """Every query of every panel (rows' own panels included)."""
    panels = [p for top in dashboard["panels"] for p in (top, *top.get("panels", ()))]
    return [
        Target(p["title"], t["refId"], t["expr"])
        for p in panels
        if p["type"] != "row"
        for t in p["targets"]
    ]


def as_grafana_sends(expr: str, range_seconds: int) -> str:
    """`expr` with the dashboard's variables replaced as Grafana does."""
    return (
        expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$__range", f"{range_seconds}s")
        .replace("$instance", ".*")
    )


def prometheus_binary() -> str:
    """The `prometheus` on the PATH; the test fails, saying how to get it, without one."""
    found = shutil.which("prometheus")
    if found is None:
        pytest.fail(
            "prometheus is not installed: run scripts/setup --dev "
            "(scripts/setup-prometheus installs Debian's package)"
        )
    return found


class Prometheus:
    """A Prometheus of its own (temporary storage, a free port) scraping
    `target` (host:port of a /metrics); stopped when the block ends."""

    def __init__(self, target: str) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="prometheus-"))
        config = self._dir / "prometheus.yml"
        config.write_text(CONFIG.format(every=SCRAPE_SECONDS, target=target))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(self._dir / "log", "wb")  # noqa: SIM115 (closed in __exit__)
        self.proc = subprocess.Popen(
            [
                prometheus_binary(),
                f"--config.file={config}",
                f"--storage.tsdb.path={self._dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def __enter__(self) -> Prometheus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def log(self) -> str:
        return (self._dir / "log").read_text(errors="replace")

    def api(self, path: str, **params: str) -> dict:
        """GET /api/v1/PATH: its `data`; an error fails with Prometheus's message."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        assert body["status"] == "success", (path, params, body)
        return body["data"]

    def query_range(self, expr: str, start: float, end: float) -> list[dict]:
        """Every series `expr` gives from `start` to `end`, a point a scrape."""
        data = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step="1")
        return data["result"]

    def wait_scraped(self, timeout: float = 120) -> None:
        """Until a scrape of the target succeeded (`up` is 1)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if any(s["value"][1] == "1" for s in self.api("query", query="up")["result"]):
                    return
            except (urllib.error.URLError, ConnectionError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no successful scrape:\n{self.log()[-3000:]}")
            time.sleep(0.5)
