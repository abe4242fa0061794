"""The generation pipeline (pipeline/generations.py) over a stand-in App,
engine-free: the real gate, fair share and tokenizing thread, no tokenizer,
no adapters, and the engine a test hands in."""

from __future__ import annotations

from types import SimpleNamespace

from rollout_service.engine.gate import AdmissionGate
from rollout_service.engine.limits import ModelLimits
from rollout_service.engine.served import Served
from rollout_service.fairness.share import FairShare
from rollout_service.generation.tokenizing import Tokenizing
from rollout_service.pipeline.calls import RunningCalls
from rollout_service.pipeline.generations import Generations
from rollout_service.pipeline.many import StreamLimits


def final_output(token_ids: list[int], prompt_token_ids: list[int]) -> SimpleNamespace:
    """An engine's one final output for a prompt, as vLLM's AsyncLLM yields
    it: `token_ids` sampled, finished for length."""
    completion = SimpleNamespace(
        index=0,
        token_ids=token_ids,
        logprobs=None,
        text="",
        finish_reason="length",
        stop_reason=None,
        weight_versions=None,
    )
    return SimpleNamespace(
        outputs=[completion],
        prompt_token_ids=prompt_token_ids,
        prompt_logprobs=None,
        num_cached_tokens=0,
        finished=True,
    )


def stand_in_pipeline(engine, fair: FairShare) -> Generations:
    """Serves version "v1"; close its `app.tokenizing` when done."""
    limits = ModelLimits(vocab_size=100, max_model_len=64, max_logprobs=5, supports_images=False)
    served = Served("v1")
    app = SimpleNamespace(
        engine=engine,
        info=SimpleNamespace(limits=limits),
        served=served,
        gate=AdmissionGate(served),
        adapters=None,
        tokenizing=Tokenizing(None),
        fair=fair,
    )
    many_limits = StreamLimits.for_server(8, 1 << 16, 4 << 20, 64)
    return Generations(app, RunningCalls(), many_limits)  # type: ignore[arg-type]
