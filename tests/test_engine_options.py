"""Engine options a trainer turns on, on one real server started with them:
LoRA adapters pushed through UpdateWeights (load, replace, remove),
--logprobs-mode processed_logprobs, and JSON schemas with vLLM's
structured-outputs config forbidding free whitespace.

float32: vLLM's CPU LoRA kernels crash the worker in bf16 on these machines
(the worker dies at the first step, no Python traceback)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from harness.serverproc import running
from harness.weights_util import COMMIT, chunk, spec, tensor_bytes
from rollout_client import RolloutClient, pb
from tests.test_rl_features import constrained, refused

PROMPT = list(range(3, 40))
RANK = 8


@pytest.fixture(scope="module")
def options_server():
    with running(
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
    ) as proc:
        yield proc


@pytest.fixture(scope="module")
def oc(options_server):
    with RolloutClient(options_server.target, timeout=120) as c:
        yield c


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


CONFIG = json.dumps({"r": RANK, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]})


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


def tokens(r: pb.GenerateResponse) -> list[int]:
    return list(r.completions[0].token_ids)


def test_an_adapter_is_loaded_replaced_and_removed(oc):
    info = oc.server_info()
    assert info.lora_limits.enabled and info.lora_limits.max_rank == RANK
    base = greedy(oc)
    a1, a2 = adapter_weights(info, 1), adapter_weights(info, 2)
    ack = oc.stub.UpdateWeights(adapter_stream("ad", "a1", a1))
    assert ack.weight_version == "a1" and ack.tensors_loaded == len(a1)
    assert {r.cache for r in ack.caches_reset if r.reset} >= {pb.CACHE_KIND_PREFIX}
    listed = oc.server_info()
    assert [(a.name, a.weight_version, a.rank) for a in listed.lora_adapters] == [
        ("ad", "a1", RANK)
    ]
    assert listed.weight_version == info.weight_version, "the base version is untouched"
    on_a1 = greedy(oc, "ad")
    assert on_a1.lora_adapter_version == "a1" and on_a1.weight_version == info.weight_version
    assert tokens(on_a1) != tokens(base), "the adapter changes the output"
    assert tokens(greedy(oc)) == tokens(base), "the base model is unchanged"

    # replacing it equals a fresh load of the new adapter under another name
    oc.stub.UpdateWeights(adapter_stream("ad", "a2", a2))
    # (the Python client's way of pushing an adapter)
    oc.update_weights(a2, "f2", adapter="fresh", adapter_config=json.loads(CONFIG))
    on_a2, fresh = greedy(oc, "ad"), greedy(oc, "fresh")
    assert on_a2.lora_adapter_version == "a2"
    assert tokens(on_a2) == tokens(fresh) != tokens(on_a1)
    assert list(on_a2.completions[0].logprobs) == pytest.approx(
        list(fresh.completions[0].logprobs), abs=1e-4
    )

    assert oc.remove_adapter("ad", "gone").weight_version == "gone"
    assert [a.name for a in oc.server_info().lora_adapters] == ["fresh"]
    assert "no adapter 'ad'" in refused(lambda: greedy(oc, "ad"))
    assert tokens(greedy(oc, "fresh")) == tokens(fresh)


def test_the_cli_pushes_and_removes_a_peft_folder(oc, options_server, tmp_path):
    from safetensors.torch import save_file

    from tests.test_cli import run

    w = adapter_weights(oc.server_info(), 5)
    save_file(w, tmp_path / "adapter_model.safetensors")
    (tmp_path / "adapter_config.json").write_text(CONFIG)
    push = ("push-weights", str(tmp_path), "--adapter", "cli", "--version", "c1")
    ack = json.loads(run(options_server, "--json", *push).stdout)
    assert ack["weight_version"] == "c1" and ack["tensors_loaded"] == len(w)
    assert "cli@c1" in run(options_server, "info").stdout
    out = json.loads(
        run(options_server, "--json", "generate", "Hi", "--lora", "cli", "--max-tokens", "4").stdout
    )
    assert out["lora_adapter_version"] == "c1"
    run(options_server, "remove-adapter", "cli", "--version", "c2")
    assert "cli" not in [a.name for a in oc.server_info().lora_adapters]


def test_bad_adapters_are_refused_before_the_engine_is_touched(oc):
    info = oc.server_info()
    w = adapter_weights(info, 3)
    before = tokens(greedy(oc))
    name = next(iter(w))
    wrong_shape = {**w, name: torch.zeros(RANK + 1, w[name].shape[1])}
    assert "shape" in refused(
        lambda: oc.stub.UpdateWeights(adapter_stream("bad", "b", wrong_shape))
    )
    half = {k: v for k, v in w.items() if "lora_B" not in k or "layers.0.self_attn.q_proj" not in k}
    assert "together with" in refused(
        lambda: oc.stub.UpdateWeights(adapter_stream("bad", "b", half))
    )
    big = json.dumps({"r": 64, "target_modules": ["q_proj"]})
    assert "--max-lora-rank" in refused(
        lambda: oc.stub.UpdateWeights(adapter_stream("bad", "b", w, config=big))
    )
    stray = {"base_model.model.model.layers.0.nothing.lora_A.weight": torch.zeros(RANK, 4)}
    assert "not a linear module" in refused(
        lambda: oc.stub.UpdateWeights(adapter_stream("bad", "b", stray))
    )
    keep = adapter_stream("bad", "b", w)
    first = next(keep)
    first.begin.pause_mode = pb.PAUSE_MODE_KEEP
    assert "base updates only" in refused(lambda: oc.stub.UpdateWeights(iter([first, *keep])))
    assert "bad" not in [a.name for a in oc.server_info().lora_adapters]
    assert tokens(greedy(oc)) == before


def test_lora_is_refused_where_it_is_off(client, info):
    w = adapter_weights(info, 4)
    assert "--enable-lora" in refused(
        lambda: client.stub.UpdateWeights(adapter_stream("x", "v", w))
    )
    assert "--enable-lora" in refused(lambda: greedy(client, "x"))
    assert not info.lora_limits.enabled


def top2_mass(c) -> list[float]:
    r = c.stub.Generate(
        pb.GenerateRequest(
            prompt_token_ids=PROMPT,
            sampling_params=pb.SamplingParams(
                max_tokens=6, temperature=0.7, top_k=2, logprobs=2, seed=0
            ),
        ),
        timeout=120,
    )
    return [sum(math.exp(lp) for lp in t.logprobs) for t in r.completions[0].top_logprobs]


def test_processed_logprobs_are_the_sampling_distribution(oc, client):
    assert oc.server_info().logprobs_mode == pb.LOGPROBS_MODE_PROCESSED_LOGPROBS
    # after temperature and top-k=2, the two candidates hold all the mass
    assert top2_mass(oc) == pytest.approx([1.0] * 6, abs=1e-3)
    # the raw model distribution (the session server's default) spreads it
    assert all(m < 0.9 for m in top2_mass(client))


SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "enum": [1, 2, 3]}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_schema_output_parses_and_fits_the_schema(oc, seed):
    out = constrained(oc.stub, seed, json_schema=json.dumps(SCHEMA))
    value = json.loads(out.text)
    assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and value["n"] in (1, 2, 3)
    assert out.finish_reason == pb.FINISH_REASON_STOP


def test_an_unknown_adapter_action_is_refused(oc):
    stream = adapter_stream("x", "v", {}, action=99, config="")
    assert refused(lambda: oc.stub.UpdateWeights(stream)).startswith("begin.adapter.action")


def test_stream_interval_is_the_floor_of_delta_tokens(oc):
    def counts(**kw):
        deltas = oc.generate_stream(
            prompt_token_ids=PROMPT, max_tokens=12, temperature=0, ignore_eos=True, **kw
        )
        return [len(d.token_ids) for d in deltas]

    default, below, above = counts(), counts(delta_tokens=2), counts(delta_tokens=5)
    assert default[0] == below[0] == above[0] == 1  # the first token at once
    assert sum(default) == sum(below) == sum(above) == 12
    assert all(c >= 3 for c in default[1:-1] + below[1:-1]), (default, below)
    assert all(c >= 5 for c in above[1:-1]) and len(above) < len(default), (above, default)
