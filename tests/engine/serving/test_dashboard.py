"""The Grafana dashboard (deploy/grafana/rollout-service.json, docs/operations.md):
every panel's query returns data from a real Prometheus (Debian's package,
scripts/setup-prometheus) scraping a real server's --metrics-port while the
Locust load test (rollout_client.load) runs generations, sessions and a
trainer's KEEP and WAIT pushes, and a caller makes refused calls. Grafana is
not installable here; its import format and variables are checked on the file.
Engine-free: the refusal counter's reading of a status's ErrorInfo reason,
and the session store's count of what its histories hold.
"""

from __future__ import annotations

import json
import math

import grpc
import pytest

from rollout.v1 import rollout_pb2 as pb
from rollout_service.ops.grpc_metrics import refusal_reason
from rollout_service.sessions.store import SessionLimits, SessionStore
from rollout_service.sessions.trajectory import SEGMENT_BYTES, TOKEN_BYTES
from rollout_service.status.trailers import details_trailer
from tests.support.prometheus import (
    DASHBOARD,
    Target,
    as_grafana_sends,
    panel_targets,
)

# Queries whose value is 0 in a healthy run under this load, each for its
# reason; every other query must show a positive value at some point of it.
MAY_BE_ZERO = {
    # The fair share's seats (112 a caller) outnumber this load's requests.
    ("Requests per caller: in the engine and waiting in the server", "B"),
    # A KEEP is held only behind another holder of the engine's lock.
    ("KEEP updates held, by phase", "A"),
    # A gate closed for a fraction of a second between 1 s scrapes.
    ("Admission closed and engine paused", "C"),
    ("Admission closed and engine paused", "D"),
    # Waiting requests in vLLM: its batch holds all of them.
    ("Engine queue and KV cache (vLLM)", "B"),
}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_dashboard_imports_anywhere_with_a_datasource_variable(dashboard):
    """Every panel and query reads the `datasource` variable (Grafana asks for
    a Prometheus on import and offers the choice in the dashboard); panels
    have distinct titles and a description."""
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["instance"]["allValue"] == ".*"
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    titles = [p["title"] for p in panels]
    assert len(titles) == len(set(titles)) and all(p["description"] for p in panels)
    uses = [p["datasource"] for p in panels] + [
        t["datasource"] for p in panels for t in p["targets"]
    ]
    assert all(ds == {"type": "prometheus", "uid": "${datasource}"} for ds in uses)
    assert all('instance=~"$instance"' in t.expr for t in panel_targets(dashboard))


class _Ended:
    """The part of a call's context the refusal counter reads."""

    def __init__(self, trailers) -> None:
        self._trailers = trailers

    def trailing_metadata(self):
        return self._trailers


def test_a_refusal_is_counted_by_its_error_info_reason():
    trailer = details_trailer(
        grpc.StatusCode.FAILED_PRECONDITION, "no", pb.ERROR_REASON_WRONG_WEIGHT_VERSION
    )
    assert refusal_reason(_Ended(trailer)) == "WRONG_WEIGHT_VERSION"
    assert refusal_reason(_Ended(())) == ""
    assert refusal_reason(_Ended(None)) == ""


def test_session_memory_grows_with_a_history_and_goes_when_it_closes():
    """What the sessions panels read (SessionStore.held): sessions open and the
    bytes their histories hold, by trajectory.py's sizes."""
    limits = SessionLimits(
        max_sessions=4,
        max_sessions_per_caller=4,
        max_session_tokens=1000,
        idle_timeout_seconds=60,
        max_model_len=100,
    )
    store = SessionStore(limits)
    assert store.held() == (0, 0)
    session = store.new("s1", owner="", budget=100)
    store.add(session)
    session.trajectory.append(pb.TOKEN_SOURCE_PROMPT, [11, 12, 13, 14])
    assert store.held() == (1, 4 * TOKEN_BYTES + SEGMENT_BYTES)
    assert store.reserved == 100
    store.close(session)
    assert store.held() == (0, 0) and store.reserved == 0


@pytest.fixture(scope="module")
def scraped_load(watched_load):
    """The session server (its --metrics-port), a Prometheus scraping it
    every second, and the window of a short Locust run against it (with
    refusals): conftest's `watched_load`, the run test_load_locust checks."""
    assert watched_load.returncode == 0, watched_load.log[-3000:]
    refused = watched_load.refused
    assert sorted(set(refused)) == ["INVALID_FIELD", "WRONG_WEIGHT_VERSION"], refused
    return watched_load


def _values(series: list[dict]) -> list[float]:
    return [float(v) for s in series for _, v in s["values"] if not math.isnan(float(v))]


@pytest.mark.timeout(420)
def test_every_panel_query_returns_data_from_a_server_under_load(dashboard, scraped_load):
    prometheus, start, end = scraped_load.prometheus, scraped_load.start, scraped_load.end
    stats = scraped_load.stats()
    assert stats[("update", "push KEEP")]["requests"] >= 1, stats
    assert stats[("update", "push WAIT")]["requests"] >= 1, stats
    assert stats[("grpc", "SessionGenerate")]["requests"] >= 1, stats
    span = math.ceil(end - start)
    empty, zero = [], []
    for target in panel_targets(dashboard):
        series = prometheus.query_range(as_grafana_sends(target.expr, span), start, end)
        values = _values(series)
        if not values:
            empty.append(target)
        elif max(values) <= 0 and (target.panel, target.ref) not in MAY_BE_ZERO:
            zero.append(target)
    assert not empty and not zero, (
        f"no data for:\n{_listing(empty)}\nonly zeros under load for:\n{_listing(zero)}"
    )
    # The dashboard's server picker lists the server.
    assert prometheus.api("label/instance/values", **{"match[]": "rollout_weight_info"})


def test_a_panel_on_a_metric_the_server_does_not_export_fails(scraped_load):
    """The check above is not vacuous: a renamed metric has no data."""
    prometheus, start, end = scraped_load.prometheus, scraped_load.start, scraped_load.end
    renamed = 'sum(rate(rollout_generate_tokenz_total{instance=~"$instance"}[$__rate_interval]))'
    expr = as_grafana_sends(renamed, math.ceil(end - start))
    assert _values(prometheus.query_range(expr, start, end)) == []


def _listing(targets: list[Target]) -> str:
    return "\n".join(f"  {t.panel} [{t.ref}]: {t.expr}" for t in targets)
