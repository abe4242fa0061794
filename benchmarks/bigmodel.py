"""A larger random Qwen2 (about 300 MB of bf16 weights) built locally, with
the tiny model's tokenizer, for weight-sync benchmarks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rollout_service.tiny_models import ensure_model

BIG = dict(
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=2,
    vocab_size=32768,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)


def build_big_model(dest: Path) -> Path:
    """A ~150 M-parameter random Qwen2 with the tiny model's tokenizer."""
    if (dest / "config.json").exists():
        return dest
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tiny = ensure_model("tiny-qwen2")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    eos = json.loads((tiny / "config.json").read_text())["eos_token_id"]
    torch.manual_seed(0)
    config = Qwen2Config(**BIG, bos_token_id=eos, eos_token_id=eos, torch_dtype="bfloat16")
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(tmp)
    for f in tiny.iterdir():
        if "token" in f.name or f.name.endswith(".jinja") or f.name == "generation_config.json":
            shutil.copy(f, tmp / f.name)
    tmp.rename(dest)
    return dest
