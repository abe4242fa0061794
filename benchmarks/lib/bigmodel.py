"""Larger random Qwen2 models built locally, with the tiny model's tokenizer,
for weight-sync benchmarks: `build_big_model` (about 300 MB of bf16 weights)
and `build_2g_model` (about 1.1 B parameters, 2.2 GB of bf16 weights). Each
is built once into the cache directory it is given."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from rollout_service.engine.tiny_models import ensure_model

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

# 1.10 B parameters: 2.21 GB of bf16, past 2 GiB (the delta-update issue's
# "a model of at least 2 GB"). 44 M per layer, 134 M in embeddings and head.
BIG_2G = dict(
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=22,
    num_attention_heads=16,
    num_key_value_heads=2,
    vocab_size=32768,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)

# Where the benchmarks keep them, under their --cache directory.
BIG_DIR = "qwen2-150m"
BIG_2G_DIR = "qwen2-1b"


def build_big_model(dest: Path) -> Path:
    """A ~150 M-parameter random Qwen2 with the tiny model's tokenizer."""
    return build_model(dest, BIG)


def build_2g_model(dest: Path) -> Path:
    """A ~1.1 B-parameter random Qwen2 (2.2 GB of bf16) with the tiny model's tokenizer."""
    return build_model(dest, BIG_2G)


def build_model(dest: Path, shape: dict[str, Any]) -> Path:
    """A random bf16 Qwen2 of `shape` (Qwen2Config fields) at `dest`, unless
    one is there already (built in a sibling directory, then renamed)."""
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
    config = Qwen2Config(**shape, bos_token_id=eos, eos_token_id=eos, torch_dtype="bfloat16")
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(tmp)
    del model
    for f in tiny.iterdir():
        if "token" in f.name or f.name.endswith(".jinja") or f.name == "generation_config.json":
            shutil.copy(f, tmp / f.name)
    tmp.rename(dest)
    return dest
