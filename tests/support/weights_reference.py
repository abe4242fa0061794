"""Weights the update tests push, and the fresh engines they compare with,
started on checkpoints of them: deterministic, so that each engine starts
while the modules before it run (tests/conftest.py's
`weights_reference_server` and `promise_reference_server`) instead of in the
module's own setup."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from harness.serverproc import ServerProcess
from harness.weights_util import checkpoint_tensors, random_weights, write_checkpoint
from rollout_service.engine.tiny_models import ensure_model

SEED = 101
# Small enough that a push of the whole model is refused (test_oversize_update_is_refused).
MAX_UPDATE_BYTES = 65536


# tests/engine/weights/test_update_promise.py's: full weights, then a subset
# of whole fused groups (layer 0's q/k/v with their biases, layer 1's
# gate/up) and a norm that travels alone; the module checks these are the
# groups the server declares.
PROMISE_SEED, PARTIAL_SEED = 1001, 1002
PARTIAL_NAMES = frozenset(
    [f"model.layers.0.self_attn.{m}_proj.{k}" for m in "qkv" for k in ("weight", "bias")]
    + [f"model.layers.1.mlp.{m}_proj.weight" for m in ("gate", "up")]
    + ["model.norm.weight"]
)


def _manifest() -> list[SimpleNamespace]:
    base = checkpoint_tensors(ensure_model("tiny-qwen2"))
    return [SimpleNamespace(name=n, shape=t.shape) for n, t in base.items()]


def new_weights() -> dict[str, torch.Tensor]:
    """New bf16 weights for every tensor of the embedded model."""
    return random_weights(_manifest(), SEED)


def promise_weights() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """test_update_promise's full bf16 weights and its partial update."""
    manifest = _manifest()
    partial = [p for p in manifest if p.name in PARTIAL_NAMES]
    return random_weights(manifest, PROMISE_SEED), random_weights(partial, PARTIAL_SEED)


def start_server(folder: Path) -> ServerProcess:
    """A fresh engine on a checkpoint (written in `folder`) of `new_weights`."""
    ckpt = write_checkpoint(ensure_model("tiny-qwen2"), new_weights(), folder)
    return ServerProcess("--model", str(ckpt), "--max-update-bytes", str(MAX_UPDATE_BYTES))


def start_promise_server(folder: Path) -> ServerProcess:
    """A fresh engine on `promise_weights` (full, then the partial over
    them), with norms stored as float32 (the bf16 values, widened: the engine
    loads them to the same bf16)."""
    base, partial = promise_weights()
    stored = {
        n: t.float() if n.endswith("norm.weight") or "layernorm" in n else t
        for n, t in {**base, **partial}.items()
    }
    ckpt = write_checkpoint(ensure_model("tiny-qwen2"), stored, folder, cast_to_base=False)
    return ServerProcess("--model", str(ckpt))
