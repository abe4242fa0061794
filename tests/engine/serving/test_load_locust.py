"""The Locust load test (rollout_client.load, docs/load-testing.md), run the
three ways a user runs it: headless against the real server (a short mix of
generations, sessions over gRPC and over their OpenAI base URL, and a
trainer's KEEP and WAIT pushes: no failure, no stale token, reports
written), the web UI (its page served), and distributed (a master and two
workers: the master's report sums theirs). The watcher fails a real run
against a server whose update gate is bypassed (a fault hook); its rules and
the trajectory checks are tested on their own, engine-free.

Locust runs as a subprocess every time: importing it patches the process for
gevent, which pytest's process must not be.
"""

from __future__ import annotations

import subprocess

import pytest

from harness.serverproc import free_port
from rollout.v1 import rollout_pb2 as pb
from rollout_client.load.options import session_url
from rollout_client.load.watcher import (
    ChatTurn,
    Watcher,
    chat_disagreement,
    spans_within,
    trajectory_disagreement,
)
from rollout_service.handoff import faults
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


def test_chat_disagreement_checks_a_base_url_sessions_ids_against_its_trajectory():
    # Opened on [1, 2]; turn 0 followed [1, 2, 3] (the generation prompt) and
    # sampled [7, 8]; the environment's message and the next generation
    # prompt appended [5, 6]; turn 1 sampled [9].
    turns = [ChatTurn([1, 2, 3], [7, 8]), ChatTurn([1, 2, 3, 7, 8, 5, 6], [9])]
    p, s, a = pb.TOKEN_SOURCE_PROMPT, pb.TOKEN_SOURCE_SAMPLED, pb.TOKEN_SOURCE_APPENDED
    spans = [span("a", 2, 3), span("b", 1, 7)]
    good = pb.GetSessionResponse(
        token_ids=[1, 2, 3, 7, 8, 5, 6, 9], sources=[p, p, a, s, s, a, a, s], version_spans=spans
    )
    assert chat_disagreement(good, [1, 2], turns) == ""
    edited = [turns[0], ChatTurn([1, 2, 3, 7, 4, 5, 6], [9])]
    assert "turn 1's prompt ids" in chat_disagreement(good, [1, 2], edited)
    wrong = pb.GetSessionResponse(token_ids=[1, 2, 3, 7, 8, 5, 6, 4], sources=good.sources)
    assert "index 7" in chat_disagreement(wrong, [1, 2], turns)
    unsampled = pb.GetSessionResponse(token_ids=good.token_ids, sources=[p, p, a, s, a, a, a, s])
    assert "sources differ" in chat_disagreement(unsampled, [1, 2], turns)
    # Each turn's versions as GetSession holds them, for the watcher.
    [(v, start, count)] = [(x.weight_version, x.start, x.count) for x in spans_within(spans, 7, 1)]
    assert (v, start, count) == ("b", 0, 1)


def test_an_openai_agents_session_url_is_the_flags_or_the_one_opensession_answered():
    opened = pb.OpenSessionResponse(
        session_id="s1", base_url="http://replica-0:8000/sessions/s1/v1"
    )
    assert session_url("", opened) == opened.base_url
    assert session_url("https://lb:443/", opened) == "https://lb:443/sessions/s1/v1"
    with pytest.raises(RuntimeError, match="--http-port"):
        session_url("", pb.OpenSessionResponse(session_id="s1"))


@pytest.mark.timeout(150)
def test_a_server_whose_gate_stamps_old_versions_fails_the_run(server, fault_file, tmp_path):
    """The server's update gate bypassed on purpose (the fault "stale-gate",
    rollout_service/handoff/faults.py: calls admitted after an update are tagged
    as if it had not happened): the stale tokens reach the client, and the
    watcher fails the run on them, everything else succeeding."""
    prefix = tmp_path / "stale"
    args = ["--headless", "-u", "3", "-r", "3", "-t", "8s", "--only-summary"]
    args += ["--rollout-target", server.target, "--push-every", "2", "--pause-modes", "wait"]
    args += ["--csv", str(prefix), "StreamUser", "TrainerUser"]
    fault_file.write_text(faults.STALE_GATE)
    try:
        done = subprocess.run(locust_cmd(args), capture_output=True, text=True, timeout=120)
    finally:
        fault_file.unlink(missing_ok=True)
    assert done.returncode == 1, done.stderr[-3000:]
    stats = read_stats(prefix)
    assert stats[("watcher", "GenerateStream versions")]["failures"] >= 1, stats
    calls = {k: v for k, v in stats.items() if k[0] in ("grpc", "update")}
    assert calls[("update", "push WAIT")]["requests"] >= 1, stats
    assert all(v["failures"] == 0 for v in calls.values()), stats
    assert read_tokens(prefix)["stale_tokens"] > 0
    assert "StaleTokens" in done.stderr, done.stderr[-3000:]


@pytest.mark.timeout(300)
def test_headless_run_mixes_generations_sessions_and_pushes_without_stale_tokens(watched_load):
    """conftest's `watched_load` (tests/support/watched_load.py): a headless
    run of generations, sessions over gRPC and over their OpenAI base URL,
    and KEEP and WAIT pushes, its reports written (test_dashboard reads the
    same run's metrics)."""
    assert watched_load.returncode == 0, watched_load.log[-3000:]
    stats = watched_load.stats()
    assert stats[("", "Aggregated")]["failures"] == 0
    for entry in [
        ("grpc", "Generate"),
        ("grpc", "GenerateStream TTFT"),
        ("grpc", "GenerateStream ITL"),
        ("grpc", "GenerateMany"),
        ("grpc", "SessionGenerate"),
        ("http", "chat turn"),
        ("watcher", "session trajectory"),
        ("watcher", "chat turn versions"),
        ("watcher", "chat trajectory"),
        ("watcher", "chat trajectory versions"),
        ("update", "pause KEEP"),
        ("update", "pause WAIT"),
        *PUSH_ENTRIES,
    ]:
        assert stats.get(entry, {}).get("requests", 0) >= 1, (entry, stats)
    tokens = watched_load.tokens()
    assert tokens["stale_tokens"] == 0 and tokens["output_tokens"] > 0, tokens
    html = watched_load.html
    assert html.read_text().count("Locust") and (html.parent / "run_stats_history.csv").exists()
    print(watched_load.log.splitlines()[-2:])


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
