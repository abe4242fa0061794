"""examples/openai_agent.py, an agent written only against the `openai` SDK
trained with GRPO on session URLs, run as a user runs it against a server
with the HTTP front (tokens, JSON without free whitespace: the same flags as
tests/engine/openai/test_http_sessions.py's), what it prints checked against the server."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from rollout_client import RolloutClient
from tests.support.tokens import ADMIN

AGENT = Path(__file__).resolve().parents[3] / "examples" / "openai_agent.py"
STEPS, GROUP, TURNS = 2, 3, 3
STEP_LINE = re.compile(
    r"^step (\d+): .* mismatch (\d+) of (\d+) sampled tokens \| prompt ids are the "
    r"trajectory's prefix: (\w+) \| (\d+) of (\d+) episodes crossed an update",
    re.M,
)


@pytest.mark.timeout(300)
def test_the_openai_agent_trains_on_session_urls(http_sessions_server):
    proc = http_sessions_server
    with RolloutClient(proc.target, token=ADMIN, timeout=30) as c:
        open_before = c.server_info().open_sessions
    args = ["--target", proc.target, "--token", ADMIN, "--steps", str(STEPS)]
    args += ["--group-size", str(GROUP), "--turns", str(TURNS)]
    run = subprocess.run(
        [sys.executable, str(AGENT), *args], capture_output=True, text=True, timeout=240
    )
    print(run.stdout)
    assert run.returncode == 0, run.stderr[-3000:]
    steps = STEP_LINE.findall(run.stdout)
    assert [int(s[0]) for s in steps] == list(range(STEPS)), run.stdout
    for _, wrong, sampled, prefix, _crossed, episodes in steps:
        # Every call the agent made was a turn of its session: the trajectory
        # holds exactly the ids the responses reported, never re-tokenized,
        # and each response's prompt is the trajectory so far.
        assert int(wrong) == 0 and prefix == "yes", run.stdout
        assert 0 < int(sampled) <= GROUP * TURNS * 32
        assert int(episodes) == GROUP
    # Step 0 ran before any push; step 1's episodes had the update pushed in
    # their middle (KEEP): their tokens carry both versions.
    crossed = [int(s[4]) for s in steps]
    assert crossed[0] == 0 and crossed[1] > 0, run.stdout
    summary = re.search(
        r"^(\d+) of (\d+) episodes crossed an update; served (\S+)", run.stdout, re.M
    )
    assert summary, run.stdout
    assert int(summary[1]) == sum(crossed) and int(summary[2]) == STEPS * GROUP
    with RolloutClient(proc.target, token=ADMIN, timeout=30) as c:
        info = c.server_info()
    # The trainer's last update is what the server serves; its sessions are closed.
    assert info.weight_version == summary[3]
    assert info.open_sessions == open_before
