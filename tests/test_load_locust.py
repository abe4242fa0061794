"""The Locust load test (rollout_client.load, docs/load-testing.md), run the
three ways a user runs it: headless against the real server (a short mix of
generations, sessions and a trainer's KEEP and WAIT pushes: no failure, no
stale token, reports written), the web UI (its page served), and distributed
(a master and two workers: the master's report sums theirs). And the
watcher, engine-free: a stale response fails a real Locust run, and its rules
and the trajectory check on their own.

Locust runs as a subprocess every time: importing it patches the process for
gevent, which pytest's process must not be.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from harness.serverproc import free_port
from rollout.v1 import rollout_pb2 as pb
from rollout_client.load.watcher import Watcher, trajectory_disagreement
from tests.support.load import Run, locust_cmd, read_stats, read_tokens

# Counted as the trainer's entries in the headless run: both pause modes ran.
PUSH_ENTRIES = {("update", "push KEEP"), ("update", "push WAIT")}


def span(version: str, count: int, start: int = 0) -> pb.VersionSpan:
    return pb.VersionSpan(weight_version=version, start=start, count=count)


def test_watcher_judges_versions_by_the_acknowledgements_seen_before_sending():
    w = Watcher()
    w.seen("v0")
    before = w.sent()  # no push acknowledged yet: any version goes
    assert w.check(before, [span("v0", 3)]).ok
    w.acknowledged("p1")
    after_p1 = w.sent()
    assert w.check(after_p1, [span("p1", 4)]).ok
    # A KEEP push acknowledged later may show up in a call sent after p1.
    w.check(before, [span("p1", 1), span("p2", 2, 1)])
    assert w.check(after_p1, [span("p1", 1), span("p2", 2, 1)]).ok
    stale = w.check(after_p1, [span("v0", 3), span("p1", 2, 3)])
    assert (stale.tokens, stale.stale_tokens, stale.stale_versions) == (5, 3, ("v0",))
    w.acknowledged("p2")
    assert w.check(w.sent(), [span("p1", 1)]).stale_tokens == 1
    assert w.check(w.sent(), [span("p2", 1)]).ok


def test_trajectory_disagreement_names_what_differs():
    turn = pb.SessionGenerateResponse(
        completion=pb.Completion(token_ids=[7, 8], version_spans=[span("a", 2)])
    )
    good = pb.GetSessionResponse(
        token_ids=[1, 2, 7, 8, 5],
        sources=[1, 1, 2, 2, 3],
        version_spans=[span("a", 2, 2)],
    )
    assert trajectory_disagreement(good, [1, 2], [turn, [5]]) == ""
    wrong_ids = pb.GetSessionResponse(token_ids=[1, 2, 7, 9, 5], sources=good.sources)
    assert "index 3" in trajectory_disagreement(wrong_ids, [1, 2], [turn, [5]])
    wrong_version = pb.GetSessionResponse(
        token_ids=good.token_ids, sources=good.sources, version_spans=[span("b", 2, 2)]
    )
    assert "versions differ" in trajectory_disagreement(wrong_version, [1, 2], [turn, [5]])


# A locustfile whose one user feeds the watcher a response that carries the
# starting version after a push was acknowledged, as a server whose update
# gate let a call through early would send it (the watcher's input, without
# a fault hook in the server).
STALE_FEEDER = """
    from locust import User, constant, task

    from rollout.v1 import rollout_pb2 as pb
    from rollout_client.load.report import Report


    class StaleFeeder(User):
        wait_time = constant(60)  # once: the run ends at its time limit

        @task
        def feed(self):
            report = Report.of(self.environment)
            report.watcher.seen("start")
            report.watcher.acknowledged("load-1")
            mark = report.watcher.sent()
            fresh = [pb.VersionSpan(weight_version="load-1", start=0, count=4)]
            report.verdict("Generate versions", mark, fresh)
            stale = [pb.VersionSpan(weight_version="start", start=0, count=4)]
            report.verdict("Generate versions", mark, stale)
"""


def test_a_stale_response_fails_the_run(tmp_path):
    locustfile = tmp_path / "locustfile.py"
    locustfile.write_text(textwrap.dedent(STALE_FEEDER))
    prefix = tmp_path / "run"
    cmd = [sys.executable, "-m", "locust", "-f", str(locustfile), "--headless"]
    cmd += ["-u", "1", "-t", "2s", "--csv", str(prefix), "--only-summary"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    stats = read_stats(prefix)
    assert stats[("watcher", "Generate versions")] == {"requests": 2, "failures": 1}
    assert "StaleTokens" in done.stderr and "4 of 4 tokens from start" in done.stderr


@pytest.mark.timeout(180)
def test_headless_run_mixes_generations_sessions_and_pushes_without_stale_tokens(server, tmp_path):
    prefix, html = tmp_path / "run", tmp_path / "report.html"
    args = ["--headless", "-u", "6", "-r", "6", "-t", "18s", "--only-summary"]
    args += ["--rollout-target", server.target, "--push-every", "3"]
    args += ["--pause-modes", "keep,wait", "--turns", "3", "--output-tokens", "16-32"]
    args += ["--csv", str(prefix), "--html", str(html)]
    done = subprocess.run(locust_cmd(args), capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    stats = read_stats(prefix)
    assert stats[("", "Aggregated")]["failures"] == 0
    for entry in [
        ("grpc", "Generate"),
        ("grpc", "GenerateStream TTFT"),
        ("grpc", "GenerateStream ITL"),
        ("grpc", "GenerateMany"),
        ("grpc", "SessionGenerate"),
        ("watcher", "session trajectory"),
        ("update", "pause KEEP"),
        ("update", "pause WAIT"),
        *PUSH_ENTRIES,
    ]:
        assert stats.get(entry, {}).get("requests", 0) >= 1, (entry, stats)
    tokens = read_tokens(prefix)
    assert tokens["stale_tokens"] == 0 and tokens["output_tokens"] > 0, tokens
    assert html.read_text().count("Locust") and (tmp_path / "run_stats_history.csv").exists()
    print(done.stderr.splitlines()[-2:])


def test_web_ui_serves_its_page():
    port = free_port()
    args = ["--web-host", "127.0.0.1", "--web-port", str(port)]
    args += ["--rollout-target", "127.0.0.1:1"]  # no user starts until the page says so
    with Run(locust_cmd(args)) as ui:
        page = ui.fetch(f"http://127.0.0.1:{port}/")
    assert "locust" in page.lower()


@pytest.mark.timeout(180)
def test_distributed_master_sums_both_workers(server, tmp_path):
    port, prefix = free_port(), tmp_path / "dist"
    master = ["--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port)]
    master += ["--headless", "--expect-workers", "2", "-u", "4", "-r", "4", "-t", "12s"]
    master += ["--rollout-target", server.target, "--csv", str(prefix), "--only-summary"]
    master += ["GenerateUser", "AgentUser"]
    worker = ["--worker", "--master-host", "127.0.0.1", "--master-port", str(port)]
    worker += ["--rollout-target", server.target, "GenerateUser", "AgentUser"]
    with Run(locust_cmd(master)) as m, Run(locust_cmd(worker)) as w1, Run(locust_cmd(worker)) as w2:
        m.wait(120)
        w1.wait(30)
        w2.wait(30)
    assert m.returncode == 0, m.log()[-3000:]
    own = [w.worker_requests() for w in (w1, w2)]
    assert all(n > 0 for n in own), own
    total = read_tokens(prefix)
    stats = read_stats(prefix)
    calls = sum(v["requests"] for (kind, _), v in stats.items() if kind in ("grpc", "update"))
    assert total["requests"] == sum(own) == calls, (own, total, calls)
    assert stats[("", "Aggregated")]["failures"] == 0
