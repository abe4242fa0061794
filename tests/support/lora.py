"""LoRA in tests: the flags of the session's LoRA server (conftest's
`lora_server`), PEFT adapter weights and configs for the embedded model, the
UpdateWeights stream that loads one, and a greedy generation through one.

float32: vLLM's CPU LoRA kernels crash the worker in bf16 on these machines
(the worker dies at the first step, no Python traceback)."""

from __future__ import annotations

import json

import torch

from harness.weights_util import COMMIT, chunk, spec, tensor_bytes
from rollout_client import pb

PROMPT = list(range(3, 40))
RANK = 8

# LoRA on, with the other engine options tests/engine/generation/test_engine_options.py checks
# on the same server: processed logprobs, whitespace-free JSON, a stream interval.
SERVER_FLAGS = (
    "--enable-lora",
    "--max-lora-rank",
    str(RANK),
    "--max-loras",
    "2",
    "--dtype",
    "float32",
    "--logprobs-mode",
    "processed_logprobs",
    "--structured-outputs-config",
    json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
    # vLLM's engine-wide floor for StreamOptions.delta_tokens
    "--stream-interval",
    "3",
)

CONFIG = json.dumps({"r": RANK, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]})


def adapter_weights(info, seed: int, modules=("q_proj", "v_proj"), rank=RANK) -> dict:
    shapes = {p.name: list(p.shape) for p in info.parameters}
    g = torch.Generator().manual_seed(seed)
    w = {}
    for layer in range(2):
        for mod in modules:
            base = f"model.layers.{layer}.self_attn.{mod}"
            out_f, in_f = shapes[base + ".weight"]
            w[f"base_model.model.{base}.lora_A.weight"] = torch.randn(rank, in_f, generator=g) * 0.3
            w[f"base_model.model.{base}.lora_B.weight"] = (
                torch.randn(out_f, rank, generator=g) * 0.3
            )
    return w


def adapter_stream(name, version, weights, action=pb.ADAPTER_ACTION_LOAD, config=CONFIG):
    names = list(weights)
    target = pb.AdapterTarget(name=name, action=action, config_json=config)
    yield pb.UpdateWeightsRequest(
        begin=pb.UpdateWeightsBegin(
            weight_version=version, tensors=[spec(n, weights[n]) for n in names], adapter=target
        )
    )
    for i, n in enumerate(names):
        yield chunk(i, 0, tensor_bytes(weights[n]))
    yield COMMIT


def greedy(c, adapter="", prompt=PROMPT) -> pb.GenerateResponse:
    req = pb.GenerateRequest(
        prompt_token_ids=prompt,
        sampling_params=pb.SamplingParams(max_tokens=12, temperature=0, logprobs=0),
        lora_adapter=adapter,
    )
    return c.stub.Generate(req, timeout=120)
