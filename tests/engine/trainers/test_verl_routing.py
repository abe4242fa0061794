"""A service lost mid-trajectory under verl (docs/verl.md, "A target lost
mid-trajectory"), driven from the verl venv by tests/verl_env/drive_lost.py:
verl's LLMServerClient runs one trajectory of three turns over two services
(rollout.custom.target lists both); the service that holds it is stopped
after the first turn. The next turn is refused by the lost service
(UNAVAILABLE, after the client's retries), goes to the other one and
completes; the prefix is recomputed there once, and the last turn stays
there and reads it from its cache.

The verl venv missing is a failure, not a skip (`scripts/setup --dev`)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rollout_service.engine.tiny_models import ensure_model
from tests.support import verl_drive

RESPONSE, PROMPT = 16, 160
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def lost(server, own_server, tmp_path_factory):
    verl_python = verl_drive.python()
    tmp = tmp_path_factory.mktemp("verl-lost")
    ready, go = tmp / "ready", tmp / "go"
    args = {
        "out": str(tmp / "lost.json"),
        "first": own_server.target,  # the trajectory starts here (tie order: first)
        "second": server.target,
        "model": str(ensure_model("tiny-qwen2")),
        "response_length": RESPONSE,
        "prompt_length": PROMPT,
        "ready": str(ready),
        "go": str(go),
    }
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(verl_drive.drive, verl_python, "drive_lost.py", args, 500)
        while not ready.exists() and not running.done():
            time.sleep(0.2)
        own_server.stop()  # the service holding the trajectory is gone
        go.write_text("")
        return running.result()


def test_the_next_turn_goes_to_the_other_service_and_completes(lost):
    first, second, third = lost["turns"]
    for t in lost["turns"]:
        assert t["n"] == RESPONSE and t["stop_reason"] == "completed", t
    # turn 1 on the first service, turns 2 and 3 on the second; turn 2
    # tried the lost one first
    assert [s["calls"] for s in lost["stats"]] == [[1, 0], [2, 1], [2, 2]], lost["stats"]
    assert [s["rerouted"] for s in lost["stats"]] == [0, 1, 1], lost["stats"]


def test_the_prefix_is_recomputed_once_on_the_new_service(lost):
    first, second, third = lost["turns"]
    # the second service never saw the trajectory: nothing of turn 2's
    # prompt was in its cache
    assert second["num_cached_tokens"] == 0, second
    # turn 3 stayed there and read turn 2's prompt back from its cache (in
    # whole cache blocks: measured 128 of its 208 tokens)
    assert third["num_cached_tokens"] > 0, third
