"""Engine options a trainer turns on, on the session's server started with
them (conftest's `lora_server`, with tests/support/lora.py's flags; the LoRA
cases of test_bad_inputs.py share it): LoRA adapters pushed through
UpdateWeights (load, replace, remove), --logprobs-mode processed_logprobs, and
JSON schemas with vLLM's structured-outputs config forbidding free whitespace."""

from __future__ import annotations

import json
import math
import tempfile
import uuid
from pathlib import Path

import pytest
import torch

from harness.weights_util import version
from rollout_client import pb
from tests.support.cli import run
from tests.support.lora import CONFIG, PROMPT, RANK, adapter_stream, adapter_weights, greedy
from tests.support.refusals import refused
from tests.support.structured import constrained


def tokens(r: pb.GenerateResponse) -> list[int]:
    return list(r.completions[0].token_ids)


def test_an_adapter_is_loaded_replaced_and_removed(lora_client):
    info = lora_client.server_info()
    assert info.lora_limits.enabled and info.lora_limits.max_rank == RANK
    base = greedy(lora_client)
    a1, a2 = adapter_weights(info, 1), adapter_weights(info, 2)
    ack = lora_client.stub.UpdateWeights(adapter_stream("ad", "a1", a1))
    assert ack.weight_version == "a1" and ack.tensors_loaded == len(a1)
    assert {r.cache for r in ack.caches_reset if r.reset} >= {pb.CACHE_KIND_PREFIX}
    listed = lora_client.server_info()
    assert [(a.name, a.weight_version, a.rank) for a in listed.lora_adapters] == [
        ("ad", "a1", RANK)
    ]
    assert listed.weight_version == info.weight_version, "the base version is untouched"
    on_a1 = greedy(lora_client, "ad")
    assert on_a1.lora_adapter_version == "a1" and on_a1.weight_version == info.weight_version
    assert tokens(on_a1) != tokens(base), "the adapter changes the output"
    assert tokens(greedy(lora_client)) == tokens(base), "the base model is unchanged"

    # replacing it equals a fresh load of the new adapter under another name
    lora_client.stub.UpdateWeights(adapter_stream("ad", "a2", a2))
    # (the Python client's way of pushing an adapter)
    lora_client.update_weights(a2, "f2", adapter="fresh", adapter_config=json.loads(CONFIG))
    on_a2, fresh = greedy(lora_client, "ad"), greedy(lora_client, "fresh")
    assert on_a2.lora_adapter_version == "a2"
    assert tokens(on_a2) == tokens(fresh) != tokens(on_a1)
    assert list(on_a2.completions[0].logprobs) == pytest.approx(
        list(fresh.completions[0].logprobs), abs=1e-4
    )

    assert lora_client.remove_adapter("ad", "gone").weight_version == "gone"
    assert [a.name for a in lora_client.server_info().lora_adapters] == ["fresh"]
    assert "no adapter 'ad'" in refused(lambda: greedy(lora_client, "ad"))
    assert tokens(greedy(lora_client, "fresh")) == tokens(fresh)


def test_the_cli_pushes_and_removes_a_peft_folder(lora_client, lora_server, tmp_path):
    from safetensors.torch import save_file

    w = adapter_weights(lora_client.server_info(), 5)
    save_file(w, tmp_path / "adapter_model.safetensors")
    (tmp_path / "adapter_config.json").write_text(CONFIG)
    push = ("push-weights", str(tmp_path), "--adapter", "cli", "--version", "c1")
    ack = json.loads(run(lora_server, "--json", *push).stdout)
    assert ack["weight_version"] == "c1" and ack["tensors_loaded"] == len(w)
    assert "cli@c1" in run(lora_server, "info").stdout
    out = json.loads(
        run(lora_server, "--json", "generate", "Hi", "--lora", "cli", "--max-tokens", "4").stdout
    )
    assert out["lora_adapter_version"] == "c1"
    run(lora_server, "remove-adapter", "cli", "--version", "c2")
    assert "cli" not in [a.name for a in lora_client.server_info().lora_adapters]


def test_bad_adapters_are_refused_before_the_engine_is_touched(lora_client):
    info = lora_client.server_info()
    w = adapter_weights(info, 3)
    before = tokens(greedy(lora_client))
    name = next(iter(w))
    wrong_shape = {**w, name: torch.zeros(RANK + 1, w[name].shape[1])}
    assert "shape" in refused(
        lambda: lora_client.stub.UpdateWeights(adapter_stream("bad", "b", wrong_shape))
    )
    half = {k: v for k, v in w.items() if "lora_B" not in k or "layers.0.self_attn.q_proj" not in k}
    assert "together with" in refused(
        lambda: lora_client.stub.UpdateWeights(adapter_stream("bad", "b", half))
    )
    big = json.dumps({"r": 64, "target_modules": ["q_proj"]})
    assert "--max-lora-rank" in refused(
        lambda: lora_client.stub.UpdateWeights(adapter_stream("bad", "b", w, config=big))
    )
    stray = {"base_model.model.model.layers.0.nothing.lora_A.weight": torch.zeros(RANK, 4)}
    assert "not a linear module" in refused(
        lambda: lora_client.stub.UpdateWeights(adapter_stream("bad", "b", stray))
    )
    keep = adapter_stream("bad", "b", w)
    first = next(keep)
    first.begin.pause_mode = pb.PAUSE_MODE_KEEP
    assert "base updates only" in refused(
        lambda: lora_client.stub.UpdateWeights(iter([first, *keep]))
    )
    assert "bad" not in [a.name for a in lora_client.server_info().lora_adapters]
    assert tokens(greedy(lora_client)) == before


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


def test_processed_logprobs_are_the_sampling_distribution(lora_client, client):
    assert lora_client.server_info().logprobs_mode == pb.LOGPROBS_MODE_PROCESSED_LOGPROBS
    # after temperature and top-k=2, the two candidates hold all the mass
    assert top2_mass(lora_client) == pytest.approx([1.0] * 6, abs=1e-3)
    # the raw model distribution (the session server's default) spreads it
    assert all(m < 0.9 for m in top2_mass(client))


SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "enum": [1, 2, 3]}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_schema_output_parses_and_fits_the_schema(lora_client, seed):
    out = constrained(lora_client.stub, seed, json_schema=json.dumps(SCHEMA))
    value = json.loads(out.text)
    assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and value["n"] in (1, 2, 3)
    assert out.finish_reason == pb.FINISH_REASON_STOP


def test_an_unknown_adapter_action_is_refused(lora_client):
    stream = adapter_stream("x", "v", {}, action=99, config="")
    assert refused(lambda: lora_client.stub.UpdateWeights(stream)).startswith(
        "begin.adapter.action"
    )


def test_stream_interval_is_the_floor_of_delta_tokens(lora_client):
    def counts(**kw):
        deltas = lora_client.generate_stream(
            prompt_token_ids=PROMPT, max_tokens=12, temperature=0, ignore_eos=True, **kw
        )
        return [len(d.token_ids) for d in deltas]

    default, below, above = counts(), counts(delta_tokens=2), counts(delta_tokens=5)
    assert default[0] == below[0] == above[0] == 1  # the first token at once
    assert sum(default) == sum(below) == sum(above) == 12
    assert all(c >= 3 for c in default[1:-1] + below[1:-1]), (default, below)
    assert all(c >= 5 for c in above[1:-1]) and len(above) < len(default), (above, default)


@pytest.mark.last  # it stops the session's float32 (LoRA) server
def test_the_adapter_folder_is_removed_at_shutdown(lora_client, lora_server):
    name = f"kept-{uuid.uuid4().hex[:8]}"
    w = adapter_weights(lora_client.server_info(), 14)
    lora_client.update_weights(w, version(), adapter=name, adapter_config=json.loads(CONFIG))
    written = list(Path(tempfile.gettempdir()).glob(f"rollout-lora-*/{name}-*"))
    assert len(written) == 1 and any(written[0].iterdir())
    assert lora_server.stop() == 0
    assert not written[0].parent.exists()


def test_a_kv_cache_size_in_bytes_is_the_engines(server):
    """--kv-cache-memory-bytes (every suite server's: tests/conftest.py) sizes
    the engine's KV cache; the server's own default (1 GiB, through vLLM's
    VLLM_CPU_KVCACHE_SPACE) does not put itself over it."""
    log = server.log.read_text(errors="replace")
    args = server.proc.args
    size = int(args[args.index("--kv-cache-memory-bytes") + 1])
    said = f"Explicitly set ({round(size / (1 << 30), 2)}/"
    assert size < 1 << 30 and said in log, [line for line in log.splitlines() if "KV" in line]
