"""verl 0.9.1's fully-async client and load balancer on the service through
rollout_client.verl (docs/verl.md), driven from the verl venv by
tests/verl_env/drive_async.py against real servers:

- a weight sync never fails a rollout: calls running while verl's naive
  hand-off pushes, calls leaving the plugin while the push runs, and calls
  a push overtook at the service's gate (refused: the version moved) all
  come back to verl's resume and end with their whole budget, tagged with
  the steps that produced them; a call still on its way when verl aborts
  is cancelled and resumed;
- with two services, every turn of a trajectory reaches the one that holds
  its prefix (each service's own prefix cache says which trajectories it
  holds), and the trajectories split between them.

The verl venv missing is a failure, not a skip (`scripts/setup --dev`)."""

from __future__ import annotations

import pytest

from rollout_client import RolloutClient
from rollout_service.engine.tiny_models import ensure_model
from tests.support import verl_drive
from tests.support.delta_steps import last_step_checkpoint

RESPONSE = 200  # every call's budget (ignore_eos: each uses all of it), seconds long
TRAJECTORIES, TURNS, PROMPT = 6, 3, 160
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def verl_python():
    return verl_drive.python()


def _drive(verl_python, tmp, **args) -> dict:
    args["out"] = str(tmp / f"{args['phase']}.json")
    return verl_drive.drive(verl_python, "drive_async.py", args, timeout=600)


@pytest.fixture(scope="module")
def synced(verl_python, server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verl-async")
    with RolloutClient(server.target, timeout=120) as c:
        prompt = list(c.tokenize(text="Once upon a time, in a land far away,").token_ids)
    return _drive(
        verl_python,
        tmp,
        phase="sync",
        target=server.target,
        model=str(ensure_model("tiny-qwen2")),
        push=str(last_step_checkpoint(tmp / "pushed")),
        prompt=prompt,
        response_length=RESPONSE,
    )


@pytest.fixture(scope="module")
def routed(verl_python, server, delta_reference, tmp_path_factory):
    # The second service: any other server on the model's tokenizer (this
    # one is shared; its weights are another step's, which routing ignores).
    tmp = tmp_path_factory.mktemp("verl-routing")
    seen = _drive(
        verl_python,
        tmp,
        phase="routing",
        target=server.target,
        second=delta_reference.target,
        model=str(ensure_model("tiny-qwen2")),
        response_length=16,
        prompt_length=PROMPT,
        turns=TURNS,
        trajectories=TRAJECTORIES,
    )
    seen["targets"] = [server.target, delta_reference.target]
    return seen


def test_a_push_during_a_fully_async_batch_fails_no_call(synced):
    first, second = synced["first_push"], synced["second_push"]
    assert len(first["versions"]) == len(second["versions"]) == 1
    calls = synced["running"] + synced["late"]
    assert len(synced["late"]) > 0
    for c in calls:
        assert "error" not in c, c  # the batch did not die of the sync
        # the budget held through the resume: all of it, no more
        assert c["n"] == c["logprobs"] == RESPONSE, c
        assert c["min_global_steps"] in (1, 2) and c["max_global_steps"] == 2, c
    # calls running at the push were aborted (not waited for) and resumed on
    # the new weights: their tokens come from both steps
    assert any(c["min_global_steps"] == 1 for c in synced["running"]), synced["running"]


def test_a_call_the_push_overtook_is_refused_and_resumed_not_failed(synced):
    # pinned to step 2, they waited at the gate while the step-3 push drained
    assert synced["refused_held_at_gate"], "the calls were admitted before the push"
    assert synced["third_push"]["versions"] == [synced["third_push"]["pushed_version"]]
    for c in synced["refused"]:
        assert "error" not in c, c
        # refused before any token (nothing of step 2), resumed on step 3
        # with the whole budget
        assert c["n"] == c["logprobs"] == RESPONSE, c
        assert c["min_global_steps"] == c["max_global_steps"] == 3, c
    assert synced["stats"]["refused_then_aborted"] >= len(synced["refused"]), synced["stats"]


def test_every_turn_of_a_trajectory_reaches_one_service(routed):
    a, b = routed["targets"]
    held_a, held_b = routed["held"][a], routed["held"][b]
    owners = []
    for j, (x, y) in enumerate(zip(held_a, held_b)):
        # exactly one service ever saw this trajectory: the other holds none
        # of its tokens (its first turn's prompt included)
        assert (x > 0) != (y > 0), (j, x, y)
        owners.append(0 if x > 0 else 1)
    # new trajectories balance: both services hold some
    assert 0 < sum(owners) < TRAJECTORIES, owners
    # the plugin's own count agrees: every call went somewhere
    assert sum(routed["stats"]["calls"]) == TRAJECTORIES * TURNS


def test_a_call_still_on_its_way_when_verl_aborts_is_cancelled_not_counted(synced):
    t = synced["transit"]
    # The service did not have it (still in transit): the plugin cancelled
    # it and counts it apart from what the service aborted.
    assert t["abort"]["cancelled_in_transit"] == ["transit"], t
    assert t["abort"]["aborted_count"] == len(t["abort"]["request_ids"]) == 0, t
    assert t["stats"]["cancelled_in_transit"] == 1, t
    # verl gets it back aborted, with nothing made (its resume re-sends it)
    assert t["held"] == {"n": 0, "stop_reason": "aborted"}, t
    # and it never reached the engine, past its transit
    assert t["engine_requests_after_transit"] == 0, t
    # the server serves again after resume_generation
    assert t["after"]["n"] == RESPONSE and t["after"]["stop_reason"] == "completed", t
