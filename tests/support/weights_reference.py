"""The new weights tests/engine/weights/test_weights.py pushes, and the fresh
engine it compares with, started on a checkpoint of them: deterministic, so
that the engine starts while the modules before it run (tests/conftest.py's
`weights_reference_server`) instead of in the module's own setup."""

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


def new_weights() -> dict[str, torch.Tensor]:
    """New bf16 weights for every tensor of the embedded model."""
    base = checkpoint_tensors(ensure_model("tiny-qwen2"))
    return random_weights([SimpleNamespace(name=n, shape=t.shape) for n, t in base.items()], SEED)


def start_server(folder: Path) -> ServerProcess:
    """A fresh engine on a checkpoint (written in `folder`) of `new_weights`."""
    ckpt = write_checkpoint(ensure_model("tiny-qwen2"), new_weights(), folder)
    return ServerProcess("--model", str(ckpt), "--max-update-bytes", str(MAX_UPDATE_BYTES))
