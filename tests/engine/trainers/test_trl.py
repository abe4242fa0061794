"""TRL's GRPOTrainer (1.16.0) trained on CPU with its rollouts from a real
server through rollout_client.trl.ServiceRollout (docs/trl.md): on the
float32 server at temperature 0.7 (processed logprobs) and on the session's
bf16 server at temperature 1 (raw logprobs). Each step's rollouts come from
the weights pushed after the previous optimizer step, the trainer's
logprobs of the rollout tokens match the service's, every push reset the
caches, and the loss stays finite."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollout_client import RolloutClient, RolloutError, pb
from rollout_client.mismatch import Mismatch, mismatch
from rollout_client.trl import METRICS, RolloutStep, ServiceRollout
from rollout_codecs import dtypes
from rollout_service.engine.tiny_models import ensure_model

# Two prompts, each a few KV blocks long (~230 tokens: its blocks land in the
# prefix cache), in this order at every step (shuffle off): each is served
# under every version, so a cache surviving a push would be hit.
PROMPTS = [
    "The quick brown fox jumps over the lazy dog. " * 10,
    "Numbers like one, two, three and four are easy to count. " * 10,
]
GROUP = 4  # completions per prompt

# Bounds on |trainer - service| logprob of a sampled token, per step, for
# ServiceRollout's measurement and for TRL's own recomputation in its loss.
# float32: both sides evaluate the same float32 weights in float32 and differ
# by kernels and reduction order only: logprobs of magnitude ~2-8, float32's
# relative step 1.2e-7, a few roundings deep. Measured: max 1.9e-6-3.3e-6
# per step, mean ~5e-7 (the notes: <= 1.5e-6 at temperature 1). 1e-4 leaves
# 30x headroom and is still 100x below the bf16 figures: a push rounded
# through bf16 fails it, and weights one step stale (pushes stopped after
# step 0) are off by a mean of 1.3 and a max of 5.
# bf16: the trainer is float32; the server holds its weights rounded to bf16
# (8 significant bits: a relative error up to 2^-9) and computes in bf16, so
# a logit of magnitude ~5 moves by up to ~0.01 and a logprob, which sums
# such errors over the vocabulary's log-sum-exp, by a few hundredths.
# Measured: per-step mean 3.9e-3-7.1e-3, max 0.012-0.022 (0.037 in
# docs/trl.md's example, 16-token completions; the notes saw up to 0.05).
# The bounds take 3x the mean and 2x the worst max.
BOUNDS = {"fp32": (1e-5, 1e-4), "bf16": (0.02, 0.1)}  # (mean, max)


@dataclass
class Run:
    steps: int  # max_steps
    rollout: ServiceRollout
    history: list[RolloutStep]  # the rollout's, after training
    trl_mismatch: list[Mismatch]  # TRL's own recomputation, per optimizer step
    reward_versions: list[tuple[int, set[str]]]  # (global_step, weight_version seen)
    log_history: list[dict[str, Any]]
    # After each push, before anything else: each prompt's cached prompt
    # tokens on its first Generate (n=1) and on a second one.
    probes: list[tuple[str, list[tuple[int, int]]]]  # (version, [(first, second)])
    final_ack: pb.UpdateWeightsResponse | None
    changed: int  # parameters the training changed
    # The reason a rollout was refused after another client changed the
    # served version behind ServiceRollout's back ("" if it was not).
    refused: str


def _train(target: str, model_path: Path, steps: int, temperature: float, out: Path) -> Run:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    trl_mismatch: list[Mismatch] = []
    reward_versions: list[tuple[int, set[str]]] = []

    class Observed(GRPOTrainer):
        """GRPOTrainer that also scores each batch with its own (private)
        recomputation, as its loss does, against the service's logprobs."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
            mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            with torch.no_grad():
                logps, _, _ = self._get_per_token_logps_and_entropies(
                    model, ids, mask, inputs["completion_ids"].size(1)
                )
            keep = inputs["completion_mask"].bool()
            trl_mismatch.append(
                mismatch(inputs["sampling_per_token_logps"][keep].tolist(), logps[keep].tolist())
            )
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def reward(completion_ids, weight_version, trainer_state, **_):
        reward_versions.append((trainer_state.global_step, set(weight_version)))
        # Toy task: the share of tokens from the lower eighth of the vocabulary.
        return [sum(t < 64 for t in ids) / len(ids) for ids in completion_ids]

    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    config = GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=GROUP * len(PROMPTS),
        num_generations=GROUP,
        gradient_accumulation_steps=1,  # one rollout per optimizer step
        max_completion_length=8,
        max_steps=steps,
        learning_rate=1e-2,  # TRL's 1e-6 would barely move a toy model
        temperature=temperature,
        shuffle_dataset=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        gradient_checkpointing=False,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    prompt_ids = [tok(text=p)["input_ids"] for p in PROMPTS]
    probes: list[tuple[str, list[tuple[int, int]]]] = []

    class Probing(RolloutClient):
        """Right after each update, each prompt twice, on one completion
        (the rollouts' own calls ask for GROUP: the count they report is one
        sibling's, which may read the blocks another one just wrote)."""

        def update_weights(self, source, version, **kw):
            ack = super().update_weights(source, version, **kw)

            def cached(ids: list[int]) -> int:
                r = self.generate(prompt_token_ids=ids, max_tokens=1, temperature=0)
                assert r.weight_version == version
                return r.usage.cached_prompt_tokens

            probes.append((version, [(cached(ids), cached(ids)) for ids in prompt_ids]))
            return ack

    with Probing(target, timeout=120) as client:
        rollout = ServiceRollout(client, delta="always")
        trainer = Observed(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=Dataset.from_dict({"prompt": PROMPTS * steps}),
            processing_class=tok,
            rollout_func=rollout,
        )
        trainer.train()
        final_ack = rollout.sync(trainer)
        history = list(rollout.history)
        with RolloutClient(target, timeout=120) as other:
            dtype = {p.name: p.dtype for p in other.server_info().parameters}["lm_head.weight"]
            head = model.lm_head.weight.detach().to(getattr(torch, dtypes.torch_name(dtype)))
            other.update_weights({"lm_head.weight": head}, f"{rollout.run_id}-other")
        try:  # the same step: no push of its own, its calls pinned to its version
            rollout([PROMPTS[0]] * GROUP, trainer)
            refused = ""
        except RolloutError as e:
            refused = e.reason
    changed = sum(not torch.equal(before[n], p) for n, p in model.named_parameters())
    return Run(
        steps,
        rollout,
        history,
        trl_mismatch,
        reward_versions,
        trainer.state.log_history,
        probes,
        final_ack,
        changed,
        refused,
    )


@pytest.fixture(scope="module")
def _quiet_cpu():
    """One trainer thread beside the server's engine on a 2-core machine;
    TRL's experimental-feature warning off."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
        yield
    torch.set_num_threads(threads)


# (server fixture, steps, temperature); the bf16 run is shorter: the same
# checks for less time.
SETUPS = {"fp32": ("fp32_server", 5, 0.7), "bf16": ("server", 3, 1.0)}


@pytest.fixture(scope="module", params=list(SETUPS))
def run(request, fp32_server, server, _quiet_cpu, tmp_path_factory) -> Run:
    """GRPOTrainer trained on `fp32_server` (its float32 checkpoint, at
    temperature 0.7: the server reports processed logprobs) or on the session
    `server` (a float32 master copy of the bf16 checkpoint, at temperature 1:
    it reports raw logprobs)."""
    name, steps, temperature = SETUPS[request.param]
    model = fp32_server.model if name == "fp32_server" else ensure_model("tiny-qwen2")
    target = fp32_server.target if name == "fp32_server" else server.target
    return _train(target, model, steps, temperature, tmp_path_factory.mktemp("trl"))


def test_each_step_rolls_out_on_the_version_pushed_after_the_previous_step(run):
    r = run.rollout
    steps = run.steps
    assert [h.step for h in run.history] == list(range(steps))  # one rollout per step
    # One push before every rollout (step 0: the initial policy), one at the end.
    versions = [a.weight_version for a in r.acks]
    assert versions == [f"{r.run_id}-step-{k}" for k in range(steps + 1)]
    assert [a.previous_weight_version for a in r.acks[1:]] == versions[:-1]
    for k, h in enumerate(run.history):
        assert h.ack is r.acks[k] and h.version == versions[k]
        assert len(h.calls) == len(PROMPTS)
        assert {c.weight_version for c in h.calls} == {versions[k]}  # every Generate's
    # The reward functions see it too (rollout_func's extra field).
    assert run.reward_versions == [(k, {versions[k]}) for k in range(steps)]
    assert run.final_ack is r.acks[-1]
    # Pinned: once the server serves other weights, a rollout is refused.
    assert run.refused == "WRONG_WEIGHT_VERSION"
    assert run.changed > 0  # the optimizer moved the policy: the pushes carried new weights


def test_every_push_after_the_first_went_as_a_delta(run):
    r = run.rollout
    assert r.acks[0].timings.decode_seconds == 0  # nothing pushed before: in full
    # Each later push named the one before as its base (at this test's
    # learning rate most tensors change past the encodings' gain and go raw
    # inside the delta; the equality of logprobs below holds all the same).
    for ack in r.acks[1:]:
        assert ack.timings.decode_seconds > 0, ack.weight_version


def test_the_trainers_logprobs_match_the_services(run, request):
    mean_bound, max_bound = BOUNDS[request.node.callspec.params["run"]]
    ours = [h.mismatch for h in run.history]
    print("\nServiceRollout's:", *ours, "TRL's own recomputation:", *run.trl_mismatch, sep="\n  ")
    assert len(ours) == len(run.trl_mismatch) == run.steps
    for m in [*ours, *run.trl_mismatch]:
        assert m is not None and m.tokens > 0, m
        assert m.mean_abs < mean_bound and m.max_abs < max_bound, m
        assert 0 <= m.kl < mean_bound, m
    # ... and they print with the run: TRL logged them with each step's metrics.
    logged = [h for h in run.log_history if "loss" in h]
    assert len(logged) == len(ours)
    for h, m in zip(logged, ours):
        assert m is not None
        assert [h[k] for k in METRICS] == pytest.approx([m.mean_abs, m.max_abs, m.kl])


def test_every_push_reset_the_caches_and_no_cache_hit_crosses_versions(run):
    r = run.rollout
    for ack in r.acks:
        assert [(c.cache, c.reset) for c in ack.caches_reset] == [
            (pb.CACHE_KIND_PREFIX, True),
            (pb.CACHE_KIND_MULTIMODAL, True),
            (pb.CACHE_KIND_ENCODER, True),
        ]
    # Every step served both prompts, so each was served under the previous
    # version when the next push came ...
    for h in run.history:
        assert [c.prompt_key for c in h.calls] == [c.prompt_key for c in run.history[0].calls]
    # ... and the first Generate of each after the push read nothing from the
    # cache, while a second one on the same version did (the prompts are long
    # enough to fill a 128-token KV block): the push emptied the cache.
    assert [v for v, _ in run.probes] == [a.weight_version for a in r.acks]
    assert len(run.probes) == run.steps + 1  # a push before each step's rollout, one at the end
    for version, counts in run.probes[1:]:
        assert all(first == 0 and again >= 128 for first, again in counts), (version, counts)


def test_the_loss_stays_finite(run):
    losses = [h["loss"] for h in run.log_history if "loss" in h]
    assert len(losses) == run.steps, run.log_history
    assert all(math.isfinite(x) for x in losses), losses


def test_importing_it_needs_no_optional_package():
    """rollout_client.trl imports torch, accelerate and trl only when used."""
    code = (
        "import sys, rollout_client.trl\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'trl', 'accelerate', 'transformers', 'numpy')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
