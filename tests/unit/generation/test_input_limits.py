"""Caller JSON, adapter names and configs, and echoed input, checked alone
(no engine): what tests/engine/generation/test_bad_inputs.py sends a real server, one rule at
a time."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import grpc
import pytest
import torch
from google.rpc import error_details_pb2

from rollout.v1 import rollout_pb2 as pb
from rollout_service.generation import json_input
from rollout_service.generation.structured import structured_outputs_from_proto
from rollout_service.handoff.staged_tensor import StagedTensor
from rollout_service.status.errors import (
    MAX_MESSAGE_BYTES,
    InvalidArgument,
    RpcError,
    bounded,
    short_repr,
)
from rollout_service.update.lora import Adapters
from rollout_service.update.lora_config import check_name, peft_config
from tests.support.aborts import aborted


def nested(depth: int, open_: str = "[", close: str = "]") -> str:
    return open_ * depth + close * depth


def refusal(call) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as e:
        call()
    return e.value


# -- JSON ---------------------------------------------------------------------


def test_nesting_is_measured_without_recursion():
    assert not json_input.deeper_than(json.loads(nested(64)), 64)
    assert json_input.deeper_than(json.loads(nested(65)), 64)
    three = {"a": 1, "b": [1, 2, {}]}  # the object, the list, the {} in it
    assert not json_input.deeper_than(three, 3)
    assert json_input.deeper_than(three, 2)
    assert not json_input.deeper_than(7, 0)
    # as deep as Python's json reaches (under its recursion limit)
    assert json_input.deeper_than(json.loads(nested(900)), 64)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[" * 50_000, "deeper than 64"),  # json.loads: RecursionError
        ('{"a": ' + nested(64) + "}", "deeper than 64"),  # parses, too deep
        ('{"x": NaN}', "NaN"),
        ('{"x": [Infinity]}', "Infinity"),
        ('{"x": -Infinity}', "-Infinity"),
        ('{"x": 1e999}', "'1e999' is out of range"),
        ('{"x": -1e400}', "out of range"),
        ('{"x": ' + "9" * 5000 + "}", "not valid JSON"),  # over 4,300 digits
        ("{", "not valid JSON"),
        ("", "not valid JSON"),
        ("[1]", "must be a JSON object (a thing)"),
        ("null", "must be a JSON object"),
    ],
)
def test_bad_json_is_refused_naming_the_field(text, problem):
    e = refusal(lambda: json_input.load_object(text, "some.field", "a thing"))
    assert e.field == "some.field" and problem in e.message, e.message


def test_good_json_is_returned():
    text = '{"a": ' + nested(63) + ', "n": 1.5, "big": 1e300, "i": ' + "9" * 300 + "}"
    value = json_input.load_object(text, "f")
    assert value["n"] == 1.5 and value["i"] == int("9" * 300)


@pytest.mark.parametrize(
    ("so", "field"),
    [
        (pb.StructuredOutput(json_schema="[" * 50_000), "json_schema"),
        (pb.StructuredOutput(json_schema='{"maximum": NaN}'), "json_schema"),
        (pb.StructuredOutput(regex="(" * 50_000), "regex"),
        (pb.StructuredOutput(regex="(" * 600 + "a" + ")" * 600), "regex"),
    ],
)
def test_structured_output_nesting_is_invalid_argument(so, field):
    e = refusal(lambda: structured_outputs_from_proto(so))
    assert e.field == f"sampling_params.structured_output.{field}"


# -- adapter names --------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "A9", "my-adapter_v2.1", "9" * 64, "a..b", "x-"])
def test_good_adapter_names(name):
    check_name(name, "f")


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".",
        "..",
        "../../../tmp/x",
        "/tmp/x",
        "x/y",
        "x\\y",
        "a" * 65,
        "a" * 300,
        "-rf",
        ".hidden",
        "_x",
        "a b",
        "a\nb",
        "a\x00b",
        "a\x7fb",
        "ad\u00e4pter",
        "a:b",
    ],
)
def test_bad_adapter_names(name):
    e = refusal(lambda: check_name(name, "begin.adapter.name"))
    assert e.field == "begin.adapter.name"
    assert "1 to 64 ASCII letters, digits" in e.message
    assert e.message.isascii() and "\n" not in e.message and "\x00" not in e.message


# -- PEFT configs -------------------------------------------------------------------

MODULES = '"target_modules": ["q_proj", "v_proj"]'


def test_a_good_config_gets_its_defaults():
    config, rank = peft_config(f'{{"r": 8, {MODULES}}}', max_rank=8)
    assert rank == 8 and config["lora_alpha"] == 8 and config["peft_type"] == "LORA"
    config, _ = peft_config('{"r": 4, "lora_alpha": 0.5, "target_modules": "q_proj"}', 8)
    assert config["lora_alpha"] == 0.5
    full = {
        "r": 2,
        "target_modules": ["q_proj"],
        "use_rslora": True,
        "bias": "none",
        "modules_to_save": None,
        "init_lora_weights": "gaussian",
        "rank_pattern": {"q_proj": 2},
        "alpha_pattern": {"q_proj": 3.5},
    }
    assert peft_config(json.dumps(full), 8)[0]["use_rslora"] is True


F = "begin.adapter.config_json"


@pytest.mark.parametrize(
    ("config", "field", "problem"),
    [
        ("[" * 50_000, F, "deeper than 64"),
        ("[]", F, "PEFT's adapter_config.json"),
        (f'{{"r": 8, "lora_alpha": NaN, {MODULES}}}', F, "NaN"),
        (f'{{"r": 8, "lora_alpha": 1e999, {MODULES}}}', F, "out of range"),
        (f"{{{MODULES}}}", f"{F}.r", "is required"),
        (f'{{"r": true, {MODULES}}}', f"{F}.r", "positive integer, got True"),
        (f'{{"r": 8.0, {MODULES}}}', f"{F}.r", "positive integer, got 8.0"),
        (f'{{"r": 0, {MODULES}}}', f"{F}.r", "positive integer, got 0"),
        (f'{{"r": "8", {MODULES}}}', f"{F}.r", "positive integer, got '8'"),
        (f'{{"r": 64, {MODULES}}}', f"{F}.r", "--max-lora-rank (8)"),
        (f'{{"r": 8, "lora_alpha": true, {MODULES}}}', f"{F}.lora_alpha", "finite number"),
        (f'{{"r": 8, "lora_alpha": "16", {MODULES}}}', f"{F}.lora_alpha", "finite number"),
        ('{"r": 8}', f"{F}.target_modules", "non-empty list"),
        ('{"r": 8, "target_modules": []}', f"{F}.target_modules", "non-empty list"),
        ('{"r": 8, "target_modules": 5}', f"{F}.target_modules", "got 5"),
        ('{"r": 8, "target_modules": ["q", 1]}', f"{F}.target_modules[1]", "module name"),
        (f'{{"r": 8, "use_rslora": "yes", {MODULES}}}', f"{F}.use_rslora", "true or false"),
        (f'{{"r": 8, "use_dora": 1, {MODULES}}}', f"{F}.use_dora", "true or false"),
        (f'{{"r": 8, "bias": null, {MODULES}}}', f"{F}.bias", "a string"),
        (
            f'{{"r": 8, "modules_to_save": "score", {MODULES}}}',
            f"{F}.modules_to_save",
            "a list or null",
        ),
        (
            f'{{"r": 8, "modules_to_save": [3], {MODULES}}}',
            f"{F}.modules_to_save[0]",
            "a string",
        ),
        (
            f'{{"r": 8, "alora_invocation_tokens": [true], {MODULES}}}',
            f"{F}.alora_invocation_tokens[0]",
            "an integer",
        ),
        (f'{{"r": 8, "rank_pattern": [], {MODULES}}}', f"{F}.rank_pattern", "an object"),
        (
            f'{{"r": 8, "rank_pattern": {{"q": true}}, {MODULES}}}',
            f"{F}.rank_pattern['q']",
            "positive integer",
        ),
        (
            f'{{"r": 8, "alpha_pattern": {{"q": "x"}}, {MODULES}}}',
            f"{F}.alpha_pattern['q']",
            "finite number",
        ),
    ],
)
def test_bad_configs_name_the_field(config, field, problem):
    e = refusal(lambda: peft_config(config, max_rank=8))
    assert e.field == field and problem in e.message, (e.field, e.message)


# -- the adapter folder -------------------------------------------------------------


def adapters(tmp_path, monkeypatch) -> Adapters:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    lora_config = SimpleNamespace(max_lora_rank=8, max_loras=2, max_cpu_loras=None)
    engine = SimpleNamespace(vllm_config=SimpleNamespace(lora_config=lora_config))
    base = {
        "model.layers.0.self_attn.q_proj.weight": pb.TensorSpec(
            name="model.layers.0.self_attn.q_proj.weight", dtype=pb.D_TYPE_FLOAT32, shape=[4, 4]
        )
    }
    # No quiesce and no region: these tests stop before either is used.
    return Adapters(engine, base, quiescer=None, incoming=None, max_update_bytes=1 << 20)


def staged(*tensors: torch.Tensor) -> tuple[SimpleNamespace, bytearray]:
    buf, specs = bytearray(), []
    for i, t in enumerate(tensors):
        data = t.contiguous().view(torch.uint8).numpy().tobytes()
        specs.append(StagedTensor(f"t{i}", "float32", tuple(t.shape), len(buf), len(data)))
        buf += data
    return SimpleNamespace(tensors=specs), buf


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_adapter_values_are_refused(tmp_path, monkeypatch, value):
    a = adapters(tmp_path, monkeypatch)
    bad = torch.ones(2, 4)
    bad[1, 2] = value
    update, buf = staged(torch.ones(2, 4), bad)
    e = refusal(lambda: a._tensors(update, memoryview(buf)))
    assert e.field == "begin.tensors[1]" and "'t1' holds NaN or infinite values" in e.message
    assert not list(tmp_path.iterdir()), "nothing written"


def test_bad_names_are_refused_at_begin_and_the_folder_goes_at_close(tmp_path, monkeypatch):
    a = adapters(tmp_path, monkeypatch)
    for action in (pb.ADAPTER_ACTION_LOAD, pb.ADAPTER_ACTION_REMOVE):
        begin = pb.UpdateWeightsBegin(
            adapter=pb.AdapterTarget(name="../x", action=action, config_json='{"r": 2}')
        )
        assert refusal(lambda b=begin: a.plan(b)).field == "begin.adapter.name"
    a.enabled = True
    assert refusal(lambda: a.check_known("a/b")).field == "lora_adapter"
    update, buf = staged(torch.ones(2, 4))
    path = a._write("ok", a._tensors(update, memoryview(buf)), {"r": 2})
    root = os.path.dirname(path)
    assert os.path.dirname(root) == str(tmp_path)
    assert os.path.basename(root).startswith(f"rollout-lora-{os.getpid()}-")
    assert os.path.basename(path).startswith("ok-")
    a.close()
    assert not os.path.exists(root)
    a.close()  # twice is fine


# -- echoed input -----------------------------------------------------------------


def test_short_repr_quotes_in_ascii_and_cuts():
    assert short_repr("ad\u00e4\n") == "'ad\\xe4\\n'"
    long = short_repr("a" * 12_000)
    assert long.endswith("... (12000 characters)") and len(long) < 160
    assert len(short_repr(list(range(10_000)))) < 160
    assert short_repr(True) == "True"


def test_bounded_cuts_by_utf8_bytes():
    assert bounded("short") == "short"
    cut = bounded("\u00e4" * 5000)
    assert len(cut.encode()) <= MAX_MESSAGE_BYTES and cut.endswith("(cut: 10000 bytes)")
    assert bounded("\ud800x").encode()  # a lone surrogate is escaped, not an error


def test_every_status_message_is_bounded():
    huge = "\u00e4" * 12_000
    assert len(RpcError(huge).message.encode()) <= MAX_MESSAGE_BYTES
    e = InvalidArgument("f" * 5000, huge)
    assert len(e.field.encode()) <= 200 and len(e.message.encode()) <= MAX_MESSAGE_BYTES
    code, details, status = aborted(e)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    assert len(bad.field_violations[0].description.encode()) <= MAX_MESSAGE_BYTES
    # the trailers stay under gRPC's 8 KiB soft metadata limit, worst case
    # (every byte of the message percent-encoded)
    trailer = 3 * len(details.encode()) + 4 * len(status.SerializeToString()) // 3
    assert trailer < 8192
    _, details, _ = aborted(RuntimeError(huge))  # INTERNAL: the exception's text
    assert len(details.encode()) <= MAX_MESSAGE_BYTES
