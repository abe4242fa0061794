"""Simulated RL steps for the delta-update tests: Adam-like steps on an fp32
master copy of the embedded model's weights, bf16 after each. Deterministic,
so that the reference server can start on the last step's weights as soon as
the tests are collected (tests/conftest.py), before any server is up."""

from __future__ import annotations

from pathlib import Path

import torch

from harness.weights_util import checkpoint_tensors, write_checkpoint
from rollout_service.engine.tiny_models import ensure_model

STEPS = 20
# Every step changes about a tenth of the bf16 values of this tiny model
# (8.6 % at the first step, 11 % at the last; an RL step at 1e-6 to 3e-6
# changes that share of a real model's): 3e-4 changed 80-90 %.
LR = 1e-5
SEED = 25


def initial() -> dict[str, torch.Tensor]:
    """The embedded model's weights, as the session server starts on them."""
    return checkpoint_tensors(ensure_model("tiny-qwen2"))


def simulate(start: dict[str, torch.Tensor], steps: int = STEPS, seed: int = SEED) -> list[dict]:
    """The bf16 weights after each of `steps` sign-of-noise steps of size LR."""
    g = torch.Generator().manual_seed(seed)
    master = {n: t.float() for n, t in start.items()}
    out = []
    for _ in range(steps):
        for n, t in master.items():
            if start[n].dtype == torch.bfloat16:
                t += LR * torch.randn(t.shape, generator=g).sign()
        out.append({n: t.to(start[n].dtype) for n, t in master.items()})
    return out


def last_step_checkpoint(dest: Path) -> Path:
    """A checkpoint folder of the last step's weights (config and tokenizer
    from the embedded model)."""
    return write_checkpoint(ensure_model("tiny-qwen2"), simulate(initial())[-1], dest)
