"""`rollout-client` end to end against the real server."""

from __future__ import annotations

import json

from safetensors.torch import save_file

from harness.weights_util import random_weights, version
from tests.support.cli import run


def test_info_json(server, info):
    out = json.loads(run(server, "--json", "info").stdout)
    assert out["model"] == info.model and out["vocab_size"] == info.vocab_size
    assert len(out["parameters"]) == len(info.parameters)


def test_info_human(server, info):
    out = run(server, "info").stdout
    assert info.model in out and "weight version" in out


def test_generate_text_and_stream_agree(server):
    args = ("generate", "Hello there", "--max-tokens", "10", "--temperature", "0")
    unary = json.loads(run(server, "--json", *args).stdout)
    streamed = run(server, *args, "--stream").stdout
    assert len(unary["completions"][0]["token_ids"]) == 10
    assert streamed.rstrip("\n") == unary["completions"][0]["text"]


def json_messages(text: str) -> list[dict]:
    decoder, out, i = json.JSONDecoder(), [], 0
    while text[i:].strip():
        i += len(text[i:]) - len(text[i:].lstrip())
        message, i = decoder.raw_decode(text, i)
        out.append(message)
    return out


def test_stream_delta_tokens_groups_the_deltas(server):
    args = ("--json", "generate", "Hello there", "--max-tokens", "10", "--temperature", "0")
    plain = json_messages(run(server, *args, "--stream").stdout)
    grouped = json_messages(run(server, *args, "--stream", "--delta-tokens", "5").stdout)
    tokens = [[t for m in ms for t in m.get("token_ids", [])] for ms in (plain, grouped)]
    assert tokens[0] == tokens[1] and len(tokens[0]) == 10
    counts = [len(m.get("token_ids", [])) for m in grouped]
    assert counts[0] == 1 and all(c >= 5 for c in counts[1:-1]), counts
    assert len(grouped) < len(plain), (counts, len(plain))


def test_generate_error_is_reported(server):
    p = run(server, "generate", "Hello", "--top-p", "2", check=False)
    assert p.returncode == 1 and "INVALID_ARGUMENT" in p.stderr and "top_p" in p.stderr


def test_push_weights_and_reset_caches(server, client, info, tmp_path):
    f = tmp_path / "head.safetensors"
    head = [p for p in info.parameters if p.name == "lm_head.weight"]
    save_file(random_weights(head, seed=99), f)
    v = version()
    ack = json.loads(run(server, "--json", "push-weights", str(f), "--version", v).stdout)
    assert ack["weight_version"] == v and ack["tensors_loaded"] == 1
    assert client.server_info().weight_version == v
    out = run(server, "reset-caches").stdout
    assert out.count("reset") == 3 and "NOT" not in out


def test_push_weights_refuses_a_mismatched_file_before_sending(server, client, tmp_path):
    import torch

    f = tmp_path / "bad.safetensors"
    save_file({"lm_head.weight": torch.zeros(3, 3, dtype=torch.bfloat16)}, f)
    before = client.server_info().weight_version
    p = run(server, "push-weights", str(f), "--version", version(), check=False)
    assert p.returncode == 1 and "lm_head.weight" in p.stderr and "shape" in p.stderr
    assert client.server_info().weight_version == before


def test_chat_constraints_tokenize_and_detokenize(server):
    chat = ("generate", "Name a color.", "--chat", "--system", "Be terse.", "--max-tokens", "8")
    out = json.loads(run(server, "--json", *chat, "--choice", "red", "--choice", "blue").stdout)
    assert out["completions"][0]["text"] in ("red", "blue")
    ids = run(server, "tokenize", "Name a color.", "--chat", "--system", "Be terse.").stdout
    assert [int(t) for t in ids.split()] == out["prompt_token_ids"]
    text = run(server, "detokenize", *ids.split(), "--skip-special").stdout
    assert "Be terse." in text and "Name a color." in text
    regex = json.loads(run(server, "--json", "generate", "Hi", "--regex", "[0-9]{3}").stdout)
    assert len(regex["completions"][0]["text"]) == 3 and regex["completions"][0]["text"].isdigit()


def test_abort_and_the_error_reason(server):
    assert "nothing was running" in run(server, "abort", "--all").stdout
    p = run(server, "generate", "Hello", "--top-p", "2", check=False)
    assert "[INVALID_FIELD]" in p.stderr
