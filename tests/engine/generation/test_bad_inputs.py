"""The bad-input battery: malformed and hostile requests across every RPC.

For each: the documented status code, a message naming the problem, the
server still healthy and the served weights' fingerprint unchanged. Auth
cases (no token, wrong role) live in test_hardening.py, on a server with auth.
Then hypothesis fuzzes the request messages.
"""

from __future__ import annotations

import math
import tempfile
import uuid
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.weights_util import COMMIT, begin, chunk, version
from rollout.v1 import rollout_pb2_grpc
from rollout_client import pb
from tests.support.lora import CONFIG, adapter_stream, adapter_weights, greedy
from tests.support.refusals import refused

INV = grpc.StatusCode.INVALID_ARGUMENT
EXH = grpc.StatusCode.RESOURCE_EXHAUSTED
FP = grpc.StatusCode.FAILED_PRECONDITION
U32 = 2**32 - 1


def gen(sp=None, **kw):
    kw.setdefault("prompt_token_ids", [1, 2, 3])
    return pb.GenerateRequest(sampling_params=pb.SamplingParams(**(sp or {})), **kw)


GENERATE_CASES = {
    "no prompt": (gen(prompt_token_ids=[]), INV, "prompt_token_ids/prompt_text/messages"),
    "both prompts": (gen(prompt_text="hi"), INV, "got prompt_token_ids and prompt_text"),
    "token past vocab": (gen(prompt_token_ids=[1, 512]), INV, "prompt_token_ids[1]"),
    "token id 2^32-1": (gen(prompt_token_ids=[U32]), INV, "outside the vocabulary"),
    "prompt over context": (gen(prompt_token_ids=[7] * 2048), INV, "max_model_len"),
    "max_tokens 0": (gen({"max_tokens": 0}), INV, "max_tokens"),
    "max_tokens 2^32-1": (gen({"max_tokens": U32}), INV, "max_tokens"),
    "temperature -1": (gen({"temperature": -1}), INV, "temperature"),
    "temperature NaN": (gen({"temperature": math.nan}), INV, "temperature"),
    "temperature inf": (gen({"temperature": math.inf}), INV, "temperature"),
    "top_p 0": (gen({"top_p": 0}), INV, "top_p"),
    "top_p 2": (gen({"top_p": 2}), INV, "top_p"),
    "top_k -5": (gen({"top_k": -5}), INV, "top_k"),
    "min_p 1.5": (gen({"min_p": 1.5}), INV, "min_p"),
    "n 0": (gen({"n": 0}), INV, "sampling_params.n"),
    # Refused by vLLM's SamplingParams, not by our checks: see errors.from_vllm.
    "n 1000000": (gen({"n": 1_000_000}), INV, "sampling_params.n: n must be at most"),
    "n 64 greedy": (gen({"n": 64, "temperature": 0}), INV, "sampling_params.n: n must be 1"),
    "logprobs 10000": (gen({"logprobs": 10000}), INV, "logprobs"),
    "empty stop string": (gen({"stop": [""]}), INV, "stop[0]"),
    "stop token past vocab": (gen({"stop_token_ids": [9999]}), INV, "stop_token_ids[0]"),
    "repetition_penalty 0": (gen({"repetition_penalty": 0}), INV, "repetition_penalty"),
    "presence_penalty 100": (gen({"presence_penalty": 100}), INV, "presence_penalty"),
    "frequency_penalty -inf": (gen({"frequency_penalty": -math.inf}), INV, "frequency_penalty"),
    "min_tokens over max": (gen({"min_tokens": 9, "max_tokens": 2}), INV, "min_tokens"),
    "image on a text model": (gen(images=[pb.Image(data=b"\x89PNG")]), INV, "images"),
    "prompt_logprobs 10000": (gen({"prompt_logprobs": 10000}), INV, "prompt_logprobs"),
    "JSON schema not JSON": (
        gen({"structured_output": pb.StructuredOutput(json_schema="{")}),
        INV,
        "structured_output.json_schema",
    ),
    "regex that does not compile": (
        gen({"structured_output": pb.StructuredOutput(regex="[a-")}),
        INV,
        "structured_output.regex",
    ),
    "empty choice": (
        gen({"structured_output": pb.StructuredOutput(choice=pb.StructuredOutput.Choices())}),
        INV,
        "structured_output.choice",
    ),
    "LoRA adapter on a server without LoRA": (gen(lora_adapter="x"), INV, "lora_adapter"),
    "messages and token ids": (
        gen(messages=[pb.ChatMessage(role="user", content=[pb.ContentPart(text="a")])]),
        INV,
        "got prompt_token_ids and messages",
    ),
    "message without role": (
        gen(prompt_token_ids=[], messages=[pb.ChatMessage(content=[pb.ContentPart(text="a")])]),
        INV,
        "messages[0].role",
    ),
    "chat options without messages": (
        gen(chat_options=pb.ChatOptions(continue_final_message=True)),
        INV,
        "chat_options",
    ),
}

# The other RPCs' request fields.
OTHER_CASES = {
    "Abort: neither ids nor all": ("Abort", pb.AbortRequest(), INV, "request_ids"),
    "Abort: ids and all": ("Abort", pb.AbortRequest(request_ids=["a"], all=True), INV, "all"),
    "Tokenize: nothing": ("Tokenize", pb.TokenizeRequest(), INV, "text/messages"),
    "Tokenize: special tokens for messages": (
        "Tokenize",
        pb.TokenizeRequest(
            messages=[pb.ChatMessage(role="user", content=[pb.ContentPart(text="a")])],
            add_special_tokens=True,
        ),
        INV,
        "add_special_tokens",
    ),
    "Detokenize: id past vocab": (
        "Detokenize",
        pb.DetokenizeRequest(token_ids=[1, U32]),
        INV,
        "token_ids[1]",
    ),
    "Sleep: no sleep mode here": ("Sleep", pb.SleepRequest(level=3), FP, "sleep mode"),
    "WakeUp: not asleep": ("WakeUp", pb.WakeUpRequest(), FP, "not asleep"),
}

# Raw bytes that are not valid messages: invalid UTF-8 in a string field,
# and a length prefix that runs past the end.
RAW_CASES = {
    "invalid UTF-8 prompt_text": ("Generate", b"\x1a\x03\xff\xfe\xfd", INV, "UTF-8"),
    "truncated GenerateRequest": ("Generate", b"\x1a\x10abc", INV, "malformed"),
    "truncated stream request": ("GenerateStream", b"\x12\x08\x01", INV, "malformed"),
    "garbage GetServerInfo": ("GetServerInfo", b"\xff\xff\xff", INV, "malformed"),
    "garbage ResetCaches": ("ResetCaches", b"\x0a\x05ab", INV, "malformed"),
}


def batch(chunks):
    return pb.UpdateWeightsRequest(
        chunks=pb.TensorChunkBatch(
            chunks=[pb.TensorChunk(tensor_index=i, offset=o, data=d) for i, o, d in chunks]
        )
    )


def update_cases(info):
    p0, p1 = info.parameters[0], info.parameters[1]
    v = version()
    return {
        "chunk before begin": ([chunk(0, 0, b"x"), COMMIT], INV, "begin"),
        "begin repeated": ([begin(v, [p0]), begin(v, [p0]), COMMIT], INV, "two begin"),
        "message after commit": ([begin(v, [p1]), COMMIT, COMMIT], INV, "after commit"),
        "empty message": ([pb.UpdateWeightsRequest()], INV, "begin"),
        "no commit": ([begin(v, [p0])], INV, "without commit"),
        "empty version": ([begin("", [p0]), COMMIT], INV, "weight_version"),
        "current version": ([begin(info.weight_version, [p0]), COMMIT], FP, "already"),
        "no tensors": ([begin(v, []), COMMIT], INV, "at least one"),
        "huge declared shape": (
            [begin(v, [pb.TensorSpec(name=p0.name, dtype=p0.dtype, shape=[2**40, 2**40])])],
            INV,
            "shape",
        ),
        "unknown dtype value": (
            [begin(v, [pb.TensorSpec(name=p0.name, dtype=99, shape=p0.shape)])],
            INV,
            "dtype",
        ),
        "unknown pause mode": ([begin(v, [p0], pause_mode=42), COMMIT], INV, "pause_mode"),
        "offset overflowing": ([begin(v, [p0]), chunk(0, 2**64 - 1, b"ab")], INV, "past"),
        "empty chunk": ([begin(v, [p0]), chunk(0, 0, b"")], INV, "empty chunk"),
        "tensor index 2^32-1": ([begin(v, [p0]), chunk(U32, 0, b"x")], INV, "tensor_index"),
        "batch of 1025 chunks": (
            [begin(v, [p0]), batch([(0, i, b"x") for i in range(1025)])],
            INV,
            "chunks.chunks: 1025 chunks, at most 1024",
        ),
        "bad chunk in a batch": (
            [begin(v, [p0]), batch([(0, 0, b"ab"), (0, 1, b"c")])],
            INV,
            "chunks.chunks[1].offset",
        ),
        "batch before begin": ([batch([(0, 0, b"x")]), COMMIT], INV, "begin"),
        "adapter without --enable-lora": (
            [
                pb.UpdateWeightsRequest(
                    begin=pb.UpdateWeightsBegin(
                        weight_version=v, adapter=pb.AdapterTarget(name="a", config_json="{}")
                    )
                ),
                COMMIT,
            ],
            INV,
            "--enable-lora",
        ),
    }


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.target) as ch:
        yield ch


def fingerprint(client):
    r = client.generate(prompt_token_ids=[9, 8, 7, 6], max_tokens=6, temperature=0)
    return r.weight_version, list(r.completions[0].token_ids)


def healthy(channel):
    r = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return r.status == health_pb2.HealthCheckResponse.SERVING


def check(call, code, needle):
    with pytest.raises(grpc.RpcError) as e:
        call()
    assert e.value.code() == code, e.value.details()
    assert needle in e.value.details(), e.value.details()


def test_battery(client, channel, info):
    stub = rollout_pb2_grpc.RolloutServiceStub(channel)
    before = fingerprint(client)
    cases = {}
    for name, (req, code, needle) in GENERATE_CASES.items():
        cases[f"Generate: {name}"] = (lambda r=req: stub.Generate(r, timeout=30), code, needle)
        stream_req = pb.GenerateStreamRequest.FromString(req.SerializeToString())
        cases[f"GenerateStream: {name}"] = (
            lambda r=stream_req: list(stub.GenerateStream(r, timeout=30)),
            code,
            needle,
        )
    for name, (method, raw, code, needle) in RAW_CASES.items():
        path = f"/rollout.v1.RolloutService/{method}"
        if method == "GenerateStream":
            call = channel.unary_stream(path)
            cases[name] = (lambda c=call, b=raw: list(c(b, timeout=30)), code, needle)
        else:
            call = channel.unary_unary(path)
            cases[name] = (lambda c=call, b=raw: c(b, timeout=30), code, needle)
    for name, (msgs, code, needle) in update_cases(info).items():
        cases[f"UpdateWeights: {name}"] = (
            lambda m=msgs: stub.UpdateWeights(iter(m), timeout=30),
            code,
            needle,
        )
    for name, (method, req, code, needle) in OTHER_CASES.items():
        rpc = getattr(stub, method)
        cases[name] = (lambda m=rpc, r=req: m(r, timeout=30), code, needle)
    raw_update = channel.stream_unary("/rollout.v1.RolloutService/UpdateWeights")
    cases["UpdateWeights: truncated message"] = (
        lambda: raw_update(iter([b"\x0a\x40\x0a"]), timeout=30),
        INV,
        "malformed",
    )
    assert len(cases) >= 30
    for name, (call, code, needle) in cases.items():
        try:
            check(call, code, needle)
            assert healthy(channel)
        except AssertionError as e:
            raise AssertionError(f"case {name!r}: {e}") from e
    assert fingerprint(client) == before


@pytest.mark.parametrize(
    "sp",
    [{"n": 1_000_000}, {"n": 64, "temperature": 0}],
    ids=["n over vLLM's limit", "n > 1 with greedy sampling"],
)
def test_engine_refusals_are_invalid_argument_naming_the_field(channel, sp):
    """What vLLM itself refuses is the caller's error, with the field named in
    the message and in a google.rpc.BadRequest field violation."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    stub = rollout_pb2_grpc.RolloutServiceStub(channel)
    with pytest.raises(grpc.RpcError) as e:
        stub.Generate(gen(sp), timeout=30)
    assert e.value.code() == INV, e.value.details()
    assert e.value.details().startswith("sampling_params.n: "), e.value.details()
    bad = error_details_pb2.BadRequest()
    assert rpc_status.from_call(e.value).details[0].Unpack(bad)
    assert bad.field_violations[0].field == "sampling_params.n"
    assert healthy(channel)


@pytest.mark.parametrize(
    ("sp", "field", "problem"),
    [
        ({"stop": ["x", ""]}, "stop[1]", "must be at least 1 characters, got ''"),
        ({"allowed_token_ids": [5, 5]}, "allowed_token_ids", "repeated value must contain unique"),
        ({"temperature": math.nan}, "temperature", "must be finite, got nan"),
    ],
)
def test_the_contracts_static_ranges_are_refused_naming_the_field(channel, sp, field, problem):
    """A value outside a range the proto states (its protovalidate options)
    is refused in the contract's words, the field named in the message and in
    the BadRequest; in a GenerateMany stream only that request fails."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    stub = rollout_pb2_grpc.RolloutServiceStub(channel)
    with pytest.raises(grpc.RpcError) as e:
        stub.Generate(gen(sp), timeout=30)
    assert e.value.code() == INV, e.value.details()
    assert e.value.details().startswith(f"sampling_params.{field}: "), e.value.details()
    assert problem in e.value.details(), e.value.details()
    bad = error_details_pb2.BadRequest()
    assert rpc_status.from_call(e.value).details[0].Unpack(bad)
    assert bad.field_violations[0].field == f"sampling_params.{field}"

    def many(request_id, sp):
        r = pb.GenerateStreamRequest(request_id=request_id, prompt_token_ids=[1, 2, 3])
        r.sampling_params.CopyFrom(pb.SamplingParams(**sp))
        return pb.GenerateManyRequest(request=r)

    out = list(
        stub.GenerateMany(iter([many("bad", sp), many("good", {"max_tokens": 2})]), timeout=60)
    )
    failures = [f for m in out for f in m.failures]
    assert [(f.request_id, f.code) for f in failures] == [("bad", INV.value[0])]
    assert failures[0].message.startswith(f"sampling_params.{field}: "), failures[0].message
    finished = [d for m in out for d in m.deltas if d.request_id == "good" and d.HasField("usage")]
    assert finished and healthy(channel)


finite = st.floats(allow_nan=True, allow_infinity=True, width=32)
sampling = st.fixed_dictionaries(
    {},
    optional={
        "max_tokens": st.integers(0, U32),
        "temperature": finite,
        "top_p": finite,
        "top_k": st.integers(-(2**31), 2**31 - 1),
        "min_p": finite,
        "seed": st.integers(-(2**63), 2**63 - 1),
        "n": st.integers(0, 4),
        "logprobs": st.integers(0, 40),
        "stop": st.lists(st.text(max_size=4), max_size=2),
        "stop_token_ids": st.lists(st.integers(0, U32), max_size=2),
        "ignore_eos": st.booleans(),
        "repetition_penalty": finite,
        "presence_penalty": finite,
        "frequency_penalty": finite,
        "min_tokens": st.integers(0, 8),
    },
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sp=sampling,
    ids=st.lists(st.integers(0, U32), max_size=6),
    text=st.text(max_size=12),
)
def test_fuzzed_generate_requests_never_break_the_server(client, channel, sp, ids, text):
    """Any request gets a result or a client-error status, never a crash."""
    sp = dict(sp)
    if sp.get("max_tokens", 0) > 8 or "max_tokens" not in sp:
        sp["max_tokens"] = min(sp.get("max_tokens", 4), 8)  # keep the run short
    if sp.get("n", 1) > 1:
        sp["n"] = 2
    req = pb.GenerateRequest(
        prompt_token_ids=ids, prompt_text=text, sampling_params=pb.SamplingParams(**sp)
    )
    stub = rollout_pb2_grpc.RolloutServiceStub(channel)
    try:
        r = stub.Generate(req, timeout=60)
        assert r.completions and all(len(c.token_ids) <= 8 for c in r.completions)
    except grpc.RpcError as e:  # either outcome is right: generated, or refused naming why
        assert e.code() in (INV, EXH), (e.code(), e.details())  # noqa: PT017
        assert e.details()  # noqa: PT017


# -- JSON that nests too deep or holds non-finite numbers; odd adapter names --


def nested(depth: int) -> str:
    """Valid JSON: objects nested `depth` levels."""
    return '{"a": ' * (depth - 1) + "{}" + "}" * (depth - 1)


CONSTRAINT_CASES = {
    "schema nested 50,000 deep": {"json_schema": "[" * 50_000},
    "schema nested 200 deep": {"json_schema": nested(200)},
    "schema with NaN": {"json_schema": '{"type": "number", "maximum": NaN}'},
    "schema with -Infinity": {"json_schema": '{"type": "number", "minimum": -Infinity}'},
    "schema with 1e999 (infinite)": {"json_schema": '{"type": "number", "maximum": 1e999}'},
    "regex nested 50,000 deep": {"regex": "(" * 50_000},
}


@pytest.mark.parametrize("constraint", CONSTRAINT_CASES.values(), ids=CONSTRAINT_CASES)
def test_malformed_constraints_are_invalid_argument(channel, constraint):
    stub = rollout_pb2_grpc.RolloutServiceStub(channel)
    req = gen({"structured_output": pb.StructuredOutput(**constraint), "max_tokens": 2})
    field = f"sampling_params.structured_output.{next(iter(constraint))}"
    check(lambda: stub.Generate(req, timeout=30), INV, field)
    stream_req = pb.GenerateStreamRequest.FromString(req.SerializeToString())
    check(lambda: list(stub.GenerateStream(stream_req, timeout=30)), INV, field)
    assert healthy(channel)


def test_a_huge_echoed_value_gets_a_bounded_message(channel, info):
    """A caller's 12,000-character value echoed whole would push the status
    past gRPC's metadata limit; the message is cut instead."""
    stub = rollout_pb2_grpc.RolloutServiceStub(channel)
    p0 = info.parameters[0]
    huge = pb.TensorSpec(name="w" * 12_000, dtype=p0.dtype, shape=p0.shape)
    msgs = [begin(version(), [huge]), COMMIT]
    check(lambda: stub.UpdateWeights(iter(msgs), timeout=30), INV, "begin.tensors[0].name")
    with pytest.raises(grpc.RpcError) as e:
        stub.UpdateWeights(iter(msgs), timeout=30)
    assert len(e.value.details().encode()) <= 1024, len(e.value.details())
    assert healthy(channel)


# LoRA cases run on the session's LoRA server (conftest's `lora_server`,
# test_engine_options' too).
LORA_NAMES = {
    "parent path": "../../../tmp/{tag}",
    "absolute path": "/tmp/{tag}",
    "separator": "{tag}/y",
    "dot-dot": "..",
    "dot": ".",
    "leading dash": "-{tag}",
    "300 characters": "a" * 300,
    "newline": "a\nb",
    "NUL": "a\x00b",
    "non-ASCII": "ad\u00e4pter",
}


def outside(tag: str) -> list[Path]:
    """What a name tagged `tag` left beside the server's adapter folder (the
    names below aim at the temporary folder that holds it)."""
    return list(Path(tempfile.gettempdir()).glob(f"*{tag}*"))


@pytest.mark.parametrize("pattern", LORA_NAMES.values(), ids=LORA_NAMES)
def test_bad_adapter_names_are_refused_and_write_nothing(lora_client, pattern):
    tag = f"adapter-{uuid.uuid4().hex[:8]}"
    name = pattern.format(tag=tag)
    w = adapter_weights(lora_client.server_info(), 11)
    details = refused(lambda: lora_client.stub.UpdateWeights(adapter_stream(name, version(), w)))
    assert details.startswith("begin.adapter.name: "), details
    assert "letters, digits" in details, details
    assert not outside(tag)
    assert name not in [a.name for a in lora_client.server_info().lora_adapters]
    removal = adapter_stream(name, version(), {}, action=pb.ADAPTER_ACTION_REMOVE, config="")
    details = refused(lambda: lora_client.stub.UpdateWeights(removal))
    assert details.startswith("begin.adapter.name: ") and "letters, digits" in details
    assert refused(lambda: greedy(lora_client, name)).startswith("lora_adapter: ")


LORA_RULE = '"target_modules": ["q_proj", "v_proj"]'
CONFIG_CASES = {
    "nested 50,000 deep": ("[" * 50_000, "begin.adapter.config_json: "),
    "nested 200 deep": (
        f'{{"r": 8, {LORA_RULE}, "x": {nested(200)}}}',
        "begin.adapter.config_json: ",
    ),
    "r true": (f'{{"r": true, {LORA_RULE}}}', "begin.adapter.config_json.r: "),
    "r 8.0": (f'{{"r": 8.0, {LORA_RULE}}}', "begin.adapter.config_json.r: "),
    "lora_alpha NaN": (f'{{"r": 8, "lora_alpha": NaN, {LORA_RULE}}}', "begin.adapter.config_json"),
    "lora_alpha 1e999": (
        f'{{"r": 8, "lora_alpha": 1e999, {LORA_RULE}}}',
        "begin.adapter.config_json",
    ),
    "lora_alpha a string": (
        f'{{"r": 8, "lora_alpha": "16", {LORA_RULE}}}',
        "begin.adapter.config_json.lora_alpha: ",
    ),
    "lora_alpha true": (
        f'{{"r": 8, "lora_alpha": true, {LORA_RULE}}}',
        "begin.adapter.config_json.lora_alpha: ",
    ),
    "target_modules a number": (
        '{"r": 8, "target_modules": 5}',
        "begin.adapter.config_json.target_modules: ",
    ),
    "use_rslora a string": (
        f'{{"r": 8, "use_rslora": "yes", {LORA_RULE}}}',
        "begin.adapter.config_json.use_rslora: ",
    ),
}


@pytest.mark.parametrize(("config", "needle"), CONFIG_CASES.values(), ids=CONFIG_CASES)
def test_malformed_adapter_configs_name_the_field(lora_client, config, needle):
    w = adapter_weights(lora_client.server_info(), 12)
    stream = adapter_stream("cfg", version(), w, config=config)
    details = refused(lambda: lora_client.stub.UpdateWeights(stream))
    assert needle in details, details
    assert "cfg" not in [a.name for a in lora_client.server_info().lora_adapters]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_adapter_values_are_refused_before_the_engine(lora_client, value):
    info = lora_client.server_info()
    w = adapter_weights(info, 13)
    names = list(w)
    w[names[1]][3, 0] = value
    details = refused(
        lambda: lora_client.stub.UpdateWeights(adapter_stream("nonfinite", version(), w))
    )
    assert details.startswith("begin.tensors[1]: ") and "finite" in details, details
    assert "nonfinite" not in [a.name for a in lora_client.server_info().lora_adapters]


def test_a_huge_adapter_name_gets_a_bounded_message(lora_client):
    name = "a" * 12_000
    for call in (
        lambda: greedy(lora_client, name),
        lambda: lora_client.stub.UpdateWeights(adapter_stream(name, version(), {}, config=CONFIG)),
    ):
        details = refused(call)
        assert details.startswith(("lora_adapter: ", "begin.adapter.name: ")), details[:200]
        assert len(details.encode()) <= 1024, len(details)
