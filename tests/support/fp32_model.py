"""A float32 copy of the embedded tiny-qwen2 (conftest's `fp32_server`
serves it): a trainer holding float32 weights and a server computing in
float32 evaluate the same function, so their logprobs differ by float32
rounding only, where the bf16 model's differ by bf16's."""

from __future__ import annotations

import shutil
from pathlib import Path

from rollout_service.engine.tiny_models import ensure_model

# What save_pretrained writes for the model itself; every other file of the
# source (the tokenizer's, its chat template) is copied as it is.
_MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors")


def build_fp32_tiny_qwen2(dest: Path) -> Path:
    """`dest`: tiny-qwen2's weights as float32 safetensors, its config saying
    float32, its generation config and its tokenizer files."""
    import torch
    from transformers import AutoModelForCausalLM

    src = ensure_model("tiny-qwen2")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    model.config.dtype = torch.float32
    model.save_pretrained(dest)  # safetensors, config.json, generation_config.json
    for f in src.iterdir():
        if f.is_file() and f.name not in _MODEL_FILES and not f.name.endswith(".safetensors"):
            shutil.copy2(f, dest / f.name)
    assert (dest / "generation_config.json").is_file()
    return dest
