"""Helpers for weight-update tests: random weights, checkpoints, raw streams."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import torch
from safetensors.torch import save_file

from rollout_client import pb
from rollout_codecs import dtypes


def random_weights(parameters, seed: int, std: float = 0.08) -> dict[str, torch.Tensor]:
    """New bf16 weights for every (or the given) manifest entries."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for p in parameters:
        t = torch.randn(list(p.shape), generator=g) * std
        if p.name.endswith("norm.weight") or "layernorm" in p.name or "layer_norm" in p.name:
            t = 1.0 + t  # norms near one keep the activations sane
        out[p.name] = t.to(torch.bfloat16)
    return out


def checkpoint_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors checkpoint in `folder`, by name."""
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def write_checkpoint(
    base: Path, weights: dict[str, torch.Tensor], dest: Path, cast_to_base: bool = True
) -> Path:
    """A copy of the checkpoint at `base` whose tensors are replaced by
    `weights` (the rest kept), as one safetensors file; each stored in the
    base's dtype, or in its own with `cast_to_base=False`."""
    shutil.copytree(base, dest)
    merged = checkpoint_tensors(dest)
    for f in dest.glob("*.safetensors"):
        f.unlink()
    for name, t in weights.items():
        assert name in merged, name
        merged[name] = t.to(merged[name].dtype) if cast_to_base else t
    (dest / "model.safetensors.index.json").unlink(missing_ok=True)
    save_file({k: v.contiguous() for k, v in merged.items()}, dest / "model.safetensors")
    return dest


def version() -> str:
    return f"v-{uuid.uuid4().hex[:8]}"


def tensor_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def spec(name: str, t: torch.Tensor, **kw) -> pb.TensorSpec:
    dtype = dtypes.from_torch(t.dtype)
    return pb.TensorSpec(name=name, dtype=dtype, shape=list(t.shape), **kw)


def begin(v: str, specs, pause_mode=pb.PAUSE_MODE_WAIT) -> pb.UpdateWeightsRequest:
    return pb.UpdateWeightsRequest(
        begin=pb.UpdateWeightsBegin(weight_version=v, tensors=specs, pause_mode=pause_mode)
    )


def chunk(index: int, offset: int, data: bytes) -> pb.UpdateWeightsRequest:
    return pb.UpdateWeightsRequest(
        chunk=pb.TensorChunk(tensor_index=index, offset=offset, data=data)
    )


COMMIT = pb.UpdateWeightsRequest(commit=pb.UpdateWeightsCommit())


def full_stream(weights: dict[str, torch.Tensor], v: str, **kw):
    """A complete, valid stream of `weights` in 64 KiB chunks."""
    names = list(weights)
    yield begin(v, [spec(n, weights[n]) for n in names], **kw)
    for i, n in enumerate(names):
        data = tensor_bytes(weights[n])
        for off in range(0, len(data), 1 << 16):
            yield chunk(i, off, data[off : off + (1 << 16)])
    yield COMMIT
