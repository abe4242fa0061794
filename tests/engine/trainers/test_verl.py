"""verl 0.9.1's own code on the service through rollout_client.verl
(docs/verl.md), in the verl venv (tests/verl_env/build.py: verl and the
client, no vLLM), against the real servers of this session:
tests/verl_env/drive.py drives verl once per module and these tests check
what it saw.

- `import verl` loads the plugin through the `verl.plugins` entry point and
  verl's own lookups resolve its classes;
- verl's LLMServerManager / LLMServerClient and its SingleTurnAgentLoop
  generate through it: ids and logprobs are the service's own answer to the
  same request;
- verl's ActorRolloutRefWorker.update_weights hands a state dict (the last
  step of tests/support/delta_steps.py) to it under global_steps=7: the
  session server then serves what a fresh engine started on those weights
  (`delta_reference`) serves, under the step's version, every cache reset;
  and a rollout after another client changed the weights is refused.

The verl venv missing is a failure, not a skip: `scripts/setup --dev`
builds it."""

from __future__ import annotations

import pytest

from rollout_client import RolloutClient, pb
from rollout_service.engine.tiny_models import ensure_model
from tests.support import verl_drive
from tests.support.delta_steps import last_step_checkpoint

STEP = 7  # verl's global_steps of the push
RESPONSE = 8  # rollout.response_length: the max_tokens verl's server sets
PROMPTS = ["The quick brown fox jumps over", "Numbers like one, two, three and"]
CHAT = "Hello there, how are you?"
# |Δ logprob| between two answers of the same bf16 weights to the same
# request: the same kernels, but not the same batch (verl's calls and ours
# run apart). The pushed weights move the logprobs by ~1e-2 (measured: max
# 0.016 on these prompts), so 2e-3 tells them apart from the weights before.
SAME = 2e-3
# verl's imports, a local Ray and its actors take about a minute of the
# first test's set-up on 2 cores (up to 4 under load).
pytestmark = pytest.mark.timeout(600)


def _greedy(client: RolloutClient, ids: list[int]) -> pb.GenerateResponse:
    """The service's own answer to what verl's agent loop sends (greedy,
    max_tokens = response_length, the sampled tokens' logprobs)."""
    return client.generate(
        prompt_token_ids=ids,
        max_tokens=RESPONSE,
        temperature=0.0,
        top_p=1.0,
        top_k=-1,
        repetition_penalty=1.0,
        logprobs=0,
    )


def _close(ours: list[float], theirs: list[float]) -> float:
    assert len(ours) == len(theirs)
    return max(abs(a - b) for a, b in zip(ours, theirs))


@pytest.fixture(scope="module")
def verl_python():
    return verl_drive.python()


@pytest.fixture(scope="module")
def run(verl_python, server, delta_reference, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verl")
    checkpoint = last_step_checkpoint(tmp / "pushed")
    with RolloutClient(server.target, timeout=120) as c:
        prompts = [list(c.tokenize(text=t).token_ids) for t in PROMPTS]
        before = [_greedy(c, ids) for ids in prompts]
    args = {
        "out": str(tmp / "out.json"),
        "target": server.target,
        "model": str(ensure_model("tiny-qwen2")),
        "push": str(checkpoint),
        "step": STEP,
        "prompts": prompts,
        "response_length": RESPONSE,
        "chat": CHAT,
    }
    seen = verl_drive.drive(verl_python, "drive.py", args, timeout=480)
    with RolloutClient(delta_reference.target, timeout=120) as ref:
        reference = [_greedy(ref, ids) for ids in prompts]
    return {
        "seen": seen,
        "target": server.target,
        "prompts": prompts,
        "before": before,
        "reference": reference,
    }


def test_verl_finds_the_plugin_through_its_entry_point(run):
    r = run["seen"]["registrations"]
    assert r["verl_version"] == "0.9.1"
    assert ["rollout_service", "rollout_client.verl"] in r["entry_points"]
    assert r["loaded_by_import_verl"]  # `import verl` alone registered it
    assert r["replica_class"] == "rollout_client.verl.replica.ServiceReplica"
    assert r["rollout_class"] == "rollout_client.verl.adapter.ServiceRollout"
    # one replica; verl's load balancer keys servers by this address
    assert run["seen"]["addresses"] == [f"{run['target']}#replica-0"]


def test_verls_client_generates_what_the_service_answers(run):
    seen = run["seen"]
    # the agent loop's sampling parameters: no max_tokens among them
    assert set(seen["sampling"]) == {
        "temperature",
        "top_p",
        "top_k",
        "repetition_penalty",
        "logprobs",
    }
    for out, own in zip(seen["before"], run["before"]):
        c = own.completions[0]
        assert out["token_ids"] == list(c.token_ids) and len(c.token_ids) == RESPONSE
        assert _close(out["log_probs"], list(c.logprobs)) < SAME
        assert out["stop_reason"] == "completed"
        assert out["extra_fields"]["weight_version"] == own.weight_version
        assert out["extra_fields"]["global_steps"] is None  # nothing pushed by verl yet


def test_the_single_turn_agent_loop_runs_on_it(run):
    for key in ("agent", "agent_after"):
        a = run["seen"][key]
        assert len(a["prompt_ids"]) > 0 and len(a["response_ids"]) == RESPONSE
        assert len(a["response_logprobs"]) == RESPONSE
    assert run["seen"]["agent"]["global_steps"] is None
    assert run["seen"]["agent_after"]["global_steps"] == STEP


def test_verls_weight_hand_off_pushes_through_the_plugin(run):
    push = run["seen"]["push"]
    assert push["iterated"] == push["tensors"] > 0  # the whole generator was read
    (version,) = push["versions"]
    assert version.endswith(f"-step-{STEP}") and push["pushed_version"] == version
    assert push["caches_reset"] == [
        [
            [pb.CACHE_KIND_PREFIX, True],
            [pb.CACHE_KIND_MULTIMODAL, True],
            [pb.CACHE_KIND_ENCODER, True],
        ]
    ]
    assert run["seen"]["server_version"] == [version, STEP]


def test_after_the_push_verl_gets_what_a_fresh_engine_on_those_weights_gives(run):
    version = run["seen"]["push"]["pushed_version"]
    moved = 0.0
    for out, ref, old in zip(run["seen"]["after"], run["reference"], run["before"]):
        c, o = ref.completions[0], old.completions[0]
        assert out["token_ids"] == list(c.token_ids)  # greedy: the same tokens
        assert _close(out["log_probs"], list(c.logprobs)) < SAME
        assert out["extra_fields"]["weight_version"] == version
        assert out["extra_fields"]["global_steps"] == STEP
        assert (
            out["extra_fields"]["min_global_steps"]
            == out["extra_fields"]["max_global_steps"]
            == STEP
        )
        moved = max(moved, _close(list(c.logprobs), list(o.logprobs)))
    # the check tells the two weights apart: before the push they differ
    assert moved > 5 * SAME, moved


def test_a_rollout_after_the_weights_changed_behind_verls_back_is_refused(run):
    assert "WRONG_WEIGHT_VERSION" in run["seen"]["refused"], run["seen"]["refused"]
