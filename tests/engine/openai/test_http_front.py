"""The OpenAI-compatible HTTP front (rollout_service/http/, docs/openai.md)
on a real engine, driven by the official `openai` SDK (sync, async,
streaming): the same core as gRPC (greedy ids and logprobs equal to Generate
on the same prompt ids, Abort over gRPC ends an HTTP call, the same weight
version), tool calls forced by structured output from a random-weight model,
response_format, n, seed, stop, bearer tokens, hostile bodies answered 4xx in
OpenAI's error shape (never 500, the server healthy after), and the front's
metrics. One server for the module, with tokens, a tool parser and JSON
without free whitespace (the random model would otherwise pad its JSON to
max_tokens)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
import socket
import threading
import time

import httpx
import openai
import pytest

from tests.support.http_front import HttpServed
from tests.support.tokens import GENERATE, GENERATE_B

MESSAGES = [{"role": "user", "content": "Tell me about the mountains."}]
# Bounded values only: a random model then ends the JSON within a few tokens.
WEATHER = {
    "type": "object",
    "properties": {"unit": {"enum": ["c", "f"]}, "days": {"enum": [1, 2, 3]}},
    "required": ["unit", "days"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"enum": ["utc", "cet"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]


@pytest.fixture(scope="module")
def served(http_front_server):
    # conftest's flags: the last test stops the server under a running
    # stream (60 s of grace); the cap test holds two streams a caller.
    proc = http_front_server
    return HttpServed(proc)


@pytest.fixture(scope="module")
def sdk(served):
    with served.sdk() as client:
        yield client


@pytest.fixture(scope="module")
def grpc_client(served):
    with served.grpc() as client:
        yield client


def test_models_lists_what_get_server_info_serves(sdk, grpc_client):
    served_model = grpc_client.server_info().model
    assert [m.id for m in sdk.models.list()] == [served_model]


def test_chat_is_generate_on_the_rendered_ids(sdk, grpc_client):
    """Greedy chat over HTTP equals a gRPC Generate of the prompt ids it
    rendered (ids, logprobs, top alternatives, text, version): one core.
    Its prompt ids are what gRPC's Tokenize renders for the same messages."""
    raw = sdk.chat.completions.with_raw_response.create(
        model="tiny-qwen2",
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"return_token_ids": True, "ignore_eos": True, "prompt_logprobs": 1},
    )
    chat = raw.parse()
    prompt_ids = chat.model_extra["prompt_token_ids"]
    assert prompt_ids == list(grpc_client.tokenize(messages=MESSAGES).token_ids)
    [choice] = chat.choices
    want = grpc_client.generate(
        prompt_token_ids=prompt_ids,
        max_tokens=8,
        temperature=0,
        ignore_eos=True,
        logprobs=2,
        prompt_logprobs=1,
    )
    [c] = want.completions
    assert choice.model_extra["token_ids"] == list(c.token_ids)
    assert choice.message.content == c.text
    assert choice.finish_reason == "length"
    got = [t.logprob for t in choice.logprobs.content]
    assert got == pytest.approx(list(c.logprobs), abs=1e-5)
    tops = [[a.logprob for a in t.top_logprobs] for t in choice.logprobs.content]
    assert tops == [pytest.approx(list(t.logprobs), abs=1e-5) for t in c.top_logprobs]
    assert chat.usage.prompt_tokens == len(prompt_ids) and chat.usage.completion_tokens == 8
    # vLLM's shape: None for the first token, then {token id: {logprob, ...}}.
    first, *rest = chat.model_extra["prompt_logprobs"]
    assert first is None
    got = [entry[str(i)]["logprob"] for entry, i in zip(rest, prompt_ids[1:])]
    assert got == pytest.approx(list(want.prompt_logprobs), abs=1e-5)
    version = grpc_client.server_info().weight_version
    assert chat.model_extra["weight_version"] == version == want.weight_version
    assert raw.headers["rollout-weight-version"] == version


def test_chat_streamed_equals_chat_unary(sdk):
    kw = dict(messages=MESSAGES, max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    whole = sdk.chat.completions.create(model="tiny-qwen2", **kw)
    chunks = list(
        sdk.chat.completions.create(
            model="tiny-qwen2", stream=True, stream_options={"include_usage": True}, **kw
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 10
    assert {c.model_extra["weight_version"] for c in chunks} == {
        whole.model_extra["weight_version"]
    }


def test_completions_text_ids_async_and_streamed(served, grpc_client):
    """/v1/completions with the async SDK: a text prompt and its token ids
    complete alike, streamed or not, as gRPC's Generate of the text."""
    text = "The old man told stories"
    want = grpc_client.generate(prompt_text=text, max_tokens=6, temperature=0, ignore_eos=True)
    ids = list(want.prompt_token_ids)

    async def run():
        async with served.async_sdk() as client:
            kw = dict(
                model="tiny-qwen2", max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
            )
            by_text = await client.completions.create(prompt=text, **kw)
            by_ids = await client.completions.create(prompt=ids, **kw)
            stream = await client.completions.create(prompt=text, stream=True, **kw)
            streamed = "".join([c.choices[0].text async for c in stream])
            return by_text, by_ids, streamed

    by_text, by_ids, streamed = asyncio.run(run())
    assert by_text.choices[0].text == by_ids.choices[0].text == streamed == want.completions[0].text
    assert by_text.usage.prompt_tokens == len(ids)


PROMPTS = ["The old man told stories", "Rivers run to the sea and"]


def _alone(sdk, prompt, **kw):
    """The one choice a request of this one prompt answers."""
    [choice] = sdk.completions.create(model="tiny-qwen2", prompt=prompt, **kw).choices
    return choice


def test_several_prompts_answer_as_each_alone(sdk, grpc_client):
    """prompt=[a, b]: choice i is what a request of prompt i alone answers
    (greedy), with its own prompt's ids; usage summed; the version on the
    response, its header and every choice. Token-id prompts alike."""
    kw = dict(
        max_tokens=6, temperature=0, extra_body={"ignore_eos": True, "return_token_ids": True}
    )
    alone = [_alone(sdk, p, **kw) for p in PROMPTS]
    raw = sdk.completions.with_raw_response.create(model="tiny-qwen2", prompt=PROMPTS, **kw)
    both = raw.parse()
    assert [c.index for c in both.choices] == [0, 1]
    for c, want in zip(both.choices, alone):
        assert c.text == want.text and c.finish_reason == "length"
        assert c.model_extra["token_ids"] == want.model_extra["token_ids"]
        assert c.model_extra["prompt_token_ids"] == want.model_extra["prompt_token_ids"]
    prompt_ids = [a.model_extra["prompt_token_ids"] for a in alone]
    assert prompt_ids[0] != prompt_ids[1] and alone[0].text != alone[1].text
    assert both.usage.prompt_tokens == sum(map(len, prompt_ids))
    assert both.usage.completion_tokens == 2 * 6
    version = grpc_client.server_info().weight_version
    assert both.model_extra["weight_version"] == raw.headers["rollout-weight-version"] == version
    assert {c.model_extra["weight_version"] for c in both.choices} == {version}
    by_ids = sdk.completions.create(model="tiny-qwen2", prompt=prompt_ids, **kw)
    assert [c.text for c in by_ids.choices] == [a.text for a in alone]


def test_several_prompts_with_n_streamed_and_not(sdk):
    """With n=2 (seeded: vLLM allows n > 1 only when sampling), choice
    i * 2 + j is prompt i's completion j, as a request of prompt i alone
    answers it; streamed, the chunks of both prompts interleave under those
    indices, and the usage chunk sums them."""
    kw = dict(model="tiny-qwen2", n=2, seed=7, temperature=1.0, max_tokens=8)
    kw["extra_body"] = {"ignore_eos": True}
    alone = [sdk.completions.create(prompt=p, **kw) for p in PROMPTS]
    both = sdk.completions.create(prompt=PROMPTS, **kw)
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    assert [c.text for c in both.choices] == [c.text for a in alone for c in a.choices]
    assert both.usage.completion_tokens == 4 * 8
    stream = sdk.completions.create(
        prompt=PROMPTS, stream=True, stream_options={"include_usage": True}, **kw
    )
    texts: dict[int, str] = {}
    order, chunks = [], list(stream)
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            order.append(c.index)
    assert texts == {c.index: c.text for c in both.choices}
    # Interleaved as they came: prompt 1's first chunk before prompt 0's last.
    assert order.index(2) < len(order) - 1 - order[::-1].index(0)
    assert chunks[-1].usage.completion_tokens == 4 * 8
    assert chunks[-1].usage.prompt_tokens == both.usage.prompt_tokens


def _prompt_tokens(served) -> float:
    """Prompt tokens the pipeline counted, every caller's."""
    for line in httpx.get(served.metrics).text.splitlines():
        if line.startswith('rollout_generate_tokens_total{kind="prompt"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_too_many_prompts_are_refused_before_any_work(served, sdk):
    """Over MAX_PROMPTS (128), or more than the caller may have in flight
    (--max-requests-per-caller 2 here: a batch of k is k calls), 400 naming
    `prompt` before anything runs: no prompt token is counted."""
    before = _prompt_tokens(served)
    for count, words in ((129, "at most 128 prompts"), (3, "send at most 2")):
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.completions.create(model="tiny-qwen2", prompt=["hi"] * count, max_tokens=1)
        assert refused.value.body["param"] == "prompt"
        assert words in refused.value.body["message"], refused.value.body
    assert _prompt_tokens(served) == before
    assert (
        len(sdk.completions.create(model="tiny-qwen2", prompt=["hi"] * 2, max_tokens=1).choices)
        == 2
    )
    assert _prompt_tokens(served) > before


BATCH_HOSTILE = [
    # (prompt, the field the error names, words of its message)
    ([], "prompt", "empty list"),
    (["hi", [1, 2]], "prompt[1]", "strings only, or lists of token ids only"),
    ([[1, 2], "hi"], "prompt[1]", "strings only, or lists of token ids only"),
    ([[1, 2], [3, "x"]], "prompt[1][1]", "a token id"),
    ([[1], [[2]]], "prompt[1][0]", "a token id"),
    (["hi", ""], "prompt[1]", "is empty"),
    ([[1], []], "prompt[1]", "is empty"),
    ([[1], [10**6]], "prompt[1][0]", "outside the vocabulary"),
    ([1 << 40], "prompt[0]", "a token id"),
]


@pytest.mark.parametrize(("prompt", "field", "words"), BATCH_HOSTILE, ids=range(len(BATCH_HOSTILE)))
def test_a_malformed_list_of_prompts_is_400_naming_the_prompt(served, prompt, field, words):
    answer = _post(served, {"prompt": prompt, "max_tokens": 2}, "/v1/completions")
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == field and words in error["message"], error
    assert httpx.get(served.url + "/health").status_code == 200


def test_one_prompt_refused_fails_the_request_and_ends_the_others(served, grpc_client):
    """A prompt too long fails the whole request (400 naming it, as `vllm
    serve` answers); the other prompt, which asked for 2,000 tokens, is
    aborted: the engine goes idle at once and its caller counts none."""
    caller = f'caller="generate:{hashlib.sha256(GENERATE_B.encode()).hexdigest()[:12]}"'
    before = _caller_tokens(httpx.get(served.metrics).text, caller)
    too_long = "word " * (grpc_client.server_info().max_model_len + 8)
    body = {"prompt": ["hello there", too_long], "max_tokens": 2000, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {GENERATE_B}"}
    answer = httpx.post(served.url + "/v1/completions", json=body, headers=headers, timeout=60)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "prompt[1]"
    deadline = time.monotonic() + 10
    while grpc_client.server_info().engine_requests:
        assert time.monotonic() < deadline, "the engine still runs the other prompt"
        time.sleep(0.05)
    assert _caller_tokens(httpx.get(served.metrics).text, caller) == before


def _engine_requests(served) -> float:
    """Engine requests the pipeline made (aborted ones included)."""
    for line in httpx.get(served.metrics).text.splitlines():
        if line.startswith("rollout_engine_requests_total "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no rollout_engine_requests_total")


def test_a_refused_prompt_starts_no_engine_request(served, sdk, grpc_client):
    """Every prompt of a batch is checked and tokenized before any starts,
    as `vllm serve` renders every prompt first: prompt[1] too long (text) or
    outside the vocabulary (ids) fails the request, streamed or not, and the
    engine never got prompt[0]. A batch that runs makes one engine request
    a prompt (the counter counts)."""
    too_long = "word " * (grpc_client.server_info().max_model_len + 8)
    before = _engine_requests(served)
    for prompts, field in (
        (["hello there", too_long], "prompt[1]"),
        ([[1, 2, 3], [10**6]], "prompt[1][0]"),
    ):
        for stream in (False, True):
            body = {"prompt": prompts, "max_tokens": 2000, "ignore_eos": True, "stream": stream}
            answer = _post(served, body, "/v1/completions")
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["param"] == field, answer.text
    assert _engine_requests(served) == before
    sdk.completions.create(model="tiny-qwen2", prompt=["hello there", "hi"], max_tokens=1)
    assert _engine_requests(served) == before + 2


def test_a_client_gone_ends_every_prompt_of_its_stream(served, grpc_client):
    """A streamed batch whose client disconnects after its first chunk: both
    prompts' engine requests end, short of the 2,000 tokens each asked for
    (a cancelled call counts none). While they run, the same caller's batch
    of 2 is 429 before any work: they are 2 of its calls (the cap is 2)."""
    caller = f'caller="generate:{hashlib.sha256(GENERATE_B.encode()).hexdigest()[:12]}"'
    before = _caller_tokens(httpx.get(served.metrics).text, caller)
    url, headers = served.url + "/v1/completions", {"Authorization": f"Bearer {GENERATE_B}"}
    body = {"prompt": PROMPTS, "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", url, json=body, headers=headers) as a,
    ):
        assert a.status_code == 200
        lines = a.iter_lines()
        assert next(lines).startswith("data:")
        over = httpx.post(url, json={"prompt": PROMPTS, "max_tokens": 1}, headers=headers)
        assert over.status_code == 429, over.text
        assert over.json()["error"]["code"] == "CALLER_QUEUE_FULL"
        assert "sent 2 prompts" in over.json()["error"]["message"]
    deadline = time.monotonic() + 10
    while grpc_client.server_info().engine_requests:
        assert time.monotonic() < deadline, "the engine still runs the abandoned prompts"
        time.sleep(0.05)
    assert _caller_tokens(httpx.get(served.metrics).text, caller) == before


def test_grpc_abort_ends_every_prompt_of_a_request(served, grpc_client):
    """The prompts of a request share its request_id: one Abort over gRPC
    ends them all, each with its tokens so far."""
    result = {}

    def run():
        with served.sdk() as client:
            result["batch"] = client.completions.create(
                model="tiny-qwen2",
                prompt=PROMPTS,
                max_tokens=1500,
                extra_body={"ignore_eos": True, "request_id": "http-batch-abort"},
            )

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 30
    while grpc_client.server_info().engine_requests < 2:  # both prompts registered and running
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert grpc_client.abort(["http-batch-abort"]).request_ids == ["http-batch-abort"]
    thread.join(60)
    choices = result["batch"].choices
    assert [c.index for c in choices] == [0, 1]
    assert all(c.finish_reason == "abort" for c in choices), choices
    assert result["batch"].usage.completion_tokens < 3000


def test_n_seed_stop_and_max_completion_tokens(sdk):
    def chat(**kw):
        return sdk.chat.completions.create(model="tiny-qwen2", messages=MESSAGES, **kw)

    sampled = chat(n=3, seed=11, temperature=1.0, max_tokens=8)
    assert sorted(c.index for c in sampled.choices) == [0, 1, 2]
    again = chat(n=3, seed=11, temperature=1.0, max_tokens=8)
    assert [c.message.content for c in again.choices] == [
        c.message.content for c in sampled.choices
    ]
    capped = chat(max_completion_tokens=3, max_tokens=9, extra_body={"ignore_eos": True})
    assert capped.usage.completion_tokens == 3  # max_completion_tokens over max_tokens
    greedy = chat(temperature=0, max_tokens=12, extra_body={"ignore_eos": True})
    full = greedy.choices[0].message.content
    stop = full[4:7]
    stopped = chat(temperature=0, max_tokens=12, stop=[stop], extra_body={"ignore_eos": True})
    assert stopped.choices[0].message.content == full[: full.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"


def _call_of(message) -> tuple[str, dict]:
    [call] = message.tool_calls
    return call.function.name, json.loads(call.function.arguments)


def _fits(name: str, arguments: dict) -> bool:
    schema = {"get_weather": WEATHER, "get_time": TIME}[name]
    props = schema["properties"]
    return set(arguments) == set(schema["required"]) and all(
        arguments[k] in props[k]["enum"] for k in arguments
    )


def test_tool_choice_forces_a_call_that_parses(sdk):
    """tool_choice "required" and a named function make even a random model
    call a tool (structured output), read back as OpenAI tool_calls."""
    kw = dict(model="tiny-qwen2", messages=MESSAGES, tools=TOOLS, max_tokens=60)
    required = sdk.chat.completions.create(tool_choice="required", parallel_tool_calls=False, **kw)
    name, arguments = _call_of(required.choices[0].message)
    assert _fits(name, arguments)
    assert required.choices[0].finish_reason == "tool_calls"
    named = sdk.chat.completions.create(
        tool_choice={"type": "function", "function": {"name": "get_time"}}, **kw
    )
    assert _call_of(named.choices[0].message)[0] == "get_time"
    assert _fits(*_call_of(named.choices[0].message))
    assert named.choices[0].finish_reason == "stop"
    stream = sdk.chat.completions.create(
        tool_choice="required", parallel_tool_calls=False, stream=True, **kw
    )
    calls = [tc for c in stream if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert len(calls) == 1 and _fits(
        calls[0].function.name, json.loads(calls[0].function.arguments)
    )


def test_auto_tool_calls_are_found_by_the_tool_parser():
    """Engine-free: with tool_choice "auto", vLLM's parser named by
    --tool-call-parser (hermes here) finds the call in the output text; the
    answer is OpenAI's tool_calls and finish_reason "tool_calls"."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    from rollout.v1 import rollout_pb2 as pb
    from rollout_service.engine.tiny_models import ensure_model
    from rollout_service.http.chat import ChatCall
    from rollout_service.http.front import Front
    from rollout_service.http.responses import chat_message, finish_reason

    tokenizer = AutoTokenizer.from_pretrained(ensure_model("tiny-qwen2"))
    app = SimpleNamespace(
        tokenizing=SimpleNamespace(tokenizer=tokenizer),
        engine=SimpleNamespace(model_config=SimpleNamespace(model="tiny-qwen2")),
    )
    request = ChatCompletionRequest.model_validate({"messages": MESSAGES, "tools": TOOLS})
    parser = Front(ready=lambda: None, tokens=None, tool_parser="hermes").parser_class(app)
    call = ChatCall(request, pb.GenerateRequest(), [], parser)
    text = 'Sure. <tool_call>\n{"name": "get_time", "arguments": {"zone": "utc"}}\n</tool_call>'
    out = pb.Completion(text=text, finish_reason=pb.FINISH_REASON_STOP)
    message, called = chat_message(call, out, app)
    assert message.content == "Sure. "
    assert _call_of(message) == ("get_time", {"zone": "utc"})
    assert finish_reason(request, out, called) == "tool_calls"


def test_the_fair_share_caller_is_grpcs(tmp_path):
    """Engine-free: an HTTP request's caller is its token's (as a gRPC
    call's: the same key), else its rollout-tenant header, else its
    connection; a missing or unknown token is 401 before anything runs."""
    import contextvars
    from types import SimpleNamespace

    from rollout_service.http.callers import authorize
    from rollout_service.http.errors import HttpError
    from rollout_service.ops.auth import Tokens

    def caller(tokens, **headers):
        request = SimpleNamespace(headers=headers, client=SimpleNamespace(host="h", port=7))
        return contextvars.copy_context().run(authorize, tokens, request)

    digest = hashlib.sha256(GENERATE.encode()).hexdigest()[:16]
    tokens = Tokens.parse([f"generate:{GENERATE}"], "test")
    by_token = caller(tokens, authorization=f"Bearer {GENERATE}", **{"rollout-tenant": "x"})
    assert by_token.key == f"token:{digest}"
    assert caller(None, **{"rollout-tenant": "team-a"}).key == "tenant:team-a"
    assert caller(None).label == "connection"
    for header in ("", "Bearer nope", GENERATE, f"Basic {GENERATE}"):
        headers = {"authorization": header} if header else {}
        with pytest.raises(HttpError) as refused:
            caller(tokens, **headers)
        assert refused.value.status == 401


def test_response_format_json_schema(sdk):
    answer = sdk.chat.completions.create(
        model="tiny-qwen2",
        messages=MESSAGES,
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": TIME}},
    )
    assert _fits("get_time", json.loads(answer.choices[0].message.content))


def test_required_weight_version_is_refused_before_any_token(sdk, grpc_client):
    version = grpc_client.server_info().weight_version
    ok = sdk.completions.create(
        model="tiny-qwen2",
        prompt="hello",
        max_tokens=2,
        extra_body={"required_weight_version": version},
    )
    assert ok.model_extra["weight_version"] == version
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.completions.create(
            model="tiny-qwen2",
            prompt="hello",
            max_tokens=2,
            extra_body={"required_weight_version": "not-" + version},
        )
    error = refused.value.body
    assert error["code"] == "WRONG_WEIGHT_VERSION"
    assert error["param"] == "required_weight_version"


def test_grpc_abort_ends_an_http_generation(served, grpc_client):
    """An HTTP call is a pipeline call: Abort over gRPC, by the request id
    and with the same token, ends it with its tokens so far."""
    result = {}

    def run():
        with served.sdk() as client:
            result["chat"] = client.chat.completions.create(
                model="tiny-qwen2",
                messages=MESSAGES,
                max_tokens=1500,
                extra_body={"ignore_eos": True, "request_id": "http-abort-me"},
            )

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 30
    while not grpc_client.abort(["http-abort-me"]).request_ids:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    thread.join(60)
    choice = result["chat"].choices[0]
    assert choice.finish_reason == "abort"
    assert result["chat"].usage.completion_tokens < 1500


def test_a_client_gone_aborts_its_engine_request(served, grpc_client):
    """A client that disconnects before its answer cancels the generation:
    the engine request ends at once, short of the tokens asked for (its
    caller's token count does not grow by them)."""
    caller = f'caller="generate:{hashlib.sha256(GENERATE_B.encode()).hexdigest()[:12]}"'
    before = _caller_tokens(httpx.get(served.metrics).text, caller)
    body = {"messages": MESSAGES, "max_tokens": 2000, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {GENERATE_B}"}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(served.url + "/v1/chat/completions", json=body, headers=headers, timeout=0.5)
    deadline = time.monotonic() + 10
    while grpc_client.server_info().engine_requests:
        assert time.monotonic() < deadline, "the engine still runs the abandoned request"
        time.sleep(0.05)
    made = _caller_tokens(httpx.get(served.metrics).text, caller) - before
    assert made < 2000  # a cancelled call counts none (the pipeline counts at its end)


def test_a_callers_cap_is_429_with_a_retry_hint(served):
    """Past --max-requests-per-caller generations in flight (two streams
    held open), the same token's next request is 429 CALLER_QUEUE_FULL with
    Retry-After, as gRPC's RESOURCE_EXHAUSTED with its RetryInfo; another
    token is served meanwhile."""
    url = served.url + "/v1/completions"
    held = {"prompt": "hi", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    headers = {"Authorization": f"Bearer {GENERATE_B}"}
    with httpx.Client(timeout=60) as one, httpx.Client(timeout=60) as two:
        with (
            one.stream("POST", url, json=held, headers=headers) as a,
            two.stream("POST", url, json=held, headers=headers) as b,
        ):
            assert a.status_code == b.status_code == 200
            # Kept: an iterator dropped closes its response (a disconnect).
            lines = a.iter_lines(), b.iter_lines()
            assert all(next(each).startswith("data:") for each in lines)
            over = httpx.post(url, json={"prompt": "hi", "max_tokens": 1}, headers=headers)
            assert over.status_code == 429, over.text
            assert over.json()["error"]["code"] == "CALLER_QUEUE_FULL"
            assert int(over.headers["Retry-After"]) >= 1
            other = {"Authorization": f"Bearer {GENERATE}"}
            assert httpx.post(url, json={"prompt": "hi", "max_tokens": 1}, headers=other).is_success


def test_bearer_tokens_as_grpc(served):
    with served.sdk("not-a-token") as wrong, pytest.raises(openai.AuthenticationError) as e:
        wrong.models.list()
    assert e.value.body["code"] == "AUTH_REQUIRED"
    missing = httpx.post(served.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1})
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "AUTH_REQUIRED"
    with served.sdk(GENERATE_B) as other:
        assert other.completions.create(model="tiny-qwen2", prompt="hi", max_tokens=1).choices
    assert httpx.get(served.url + "/health").json() == {"status": "SERVING"}


def _post(served, body: bytes | dict, route: str = "/v1/chat/completions"):
    headers = {"Authorization": f"Bearer {GENERATE}", "Content-Type": "application/json"}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(served.url + route, content=data, headers=headers, timeout=60)


HOSTILE = [
    # (body, the field the error names, status)
    (b"x" * (17 << 20), None, 413),
    (b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "body", 400),
    (b"not json", "body", 400),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "body", 400),
    ({"messages": "hi"}, "messages", 400),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}, "max_tokens", 400),
    ({"messages": [{"role": "user", "content": "hi"}], "bogus": 1}, "bogus", 400),
    ({"messages": [{"role": "user", "content": "hi"}] * 5000}, "messages", 400),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 0}, "n", 400),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6}, "max_tokens", 400),
    (
        {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 99},
        "top_logprobs",
        400,
    ),
    (
        {"messages": [{"role": "user", "content": "hi"}], "use_beam_search": True},
        "use_beam_search",
        400,
    ),
    ({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto"}, "tool_choice", 400),
    (
        {
            "messages": [{"role": "user", "content": "hi"}],
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "nope"}},
        },
        "tool_choice",
        400,
    ),
    ({"messages": [{"role": "user", "content": "hi"}], "model": "no-such-model"}, "model", 400),
    ({"prompt": [10**6], "max_tokens": 2}, "prompt[0]", 400),
]


@pytest.mark.parametrize(("body", "field", "status"), HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_bodies_get_4xx_naming_the_field(served, body, field, status):
    route = "/v1/completions" if isinstance(body, dict) and "prompt" in body else None
    answer = _post(served, body, route or "/v1/chat/completions")
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["param"] == field, error
    assert error["type"] and error["message"]
    if isinstance(body, dict) and len(body.get("messages", ())) > 4096:  # before rendering
        assert "at most 4096 entries" in error["message"]
    assert httpx.get(served.url + "/health").status_code == 200


def test_a_body_over_the_limit_is_refused_unread(served):
    """413 for a body sent in chunks past 16 MiB (no length declared), and
    for a declared length past it before a byte of the body is read."""
    headers = {"Authorization": f"Bearer {GENERATE}", "Content-Type": "application/json"}

    def chunks():
        for _ in range(17):
            yield b" " * (1 << 20)

    sent = httpx.post(
        served.url + "/v1/chat/completions", content=chunks(), headers=headers, timeout=60
    )
    assert sent.status_code == 413 and sent.json()["error"]["message"].startswith("the body")
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {GENERATE}\r\nContent-Length: {20 << 20}\r\n\r\n{{".encode()
        )
        assert s.recv(4096).startswith(b"HTTP/1.1 413")
    assert httpx.get(served.url + "/health").status_code == 200


def test_auto_tool_choice_needs_a_parser():
    """Engine-free: without --tool-call-parser, tools with tool_choice
    "auto" (the SDK's default) are refused naming tool_choice, before any
    rendering."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    from rollout_service.http.chat import chat_settings
    from rollout_service.http.front import Front
    from rollout_service.status.errors import InvalidArgument

    request = ChatCompletionRequest.model_validate({"messages": MESSAGES, "tools": TOOLS})
    with pytest.raises(InvalidArgument) as refused:
        chat_settings(request, Front(ready=lambda: None, tokens=None), app=None)
    assert refused.value.field == "tool_choice"


def test_the_front_is_metered_and_shares_by_token(served, sdk):
    """Requests counted by route and status; a generation's tokens counted
    against its bearer token in the fair share, as a gRPC call's are."""
    caller = f'caller="generate:{hashlib.sha256(GENERATE.encode()).hexdigest()[:12]}"'
    before = _caller_tokens(httpx.get(served.metrics).text, caller)
    sdk.completions.create(
        model="tiny-qwen2", prompt="hi", max_tokens=3, extra_body={"ignore_eos": True}
    )
    _post(served, {"messages": "hi"})
    text = httpx.get(served.metrics).text
    assert _caller_tokens(text, caller) == before + 3
    assert 'rollout_http_requests_total{route="/v1/completions",status="200"}' in text
    assert 'rollout_http_requests_total{route="/v1/chat/completions",status="400"}' in text
    assert 'rollout_http_request_duration_seconds_count{route="/v1/completions"}' in text


def _caller_tokens(metrics: str, caller: str) -> float:
    """A caller's completion tokens in the fair share's counter."""
    for line in metrics.splitlines():
        if line.startswith("rollout_caller_tokens_total{") and caller in line:
            if 'kind="completion"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _refused_while_it_stops(served: HttpServed) -> list[int]:
    """The statuses of new requests sent after a SIGTERM until one is
    refused its connection, within 10 s (docs/openai.md: a replica that is
    shutting down answers 503 until its HTTP front has closed); each answered
    one is a 200 sent before the stop began, or a 503 naming SHUTTING_DOWN.
    A request whose connection the front accepted as it closed has that
    connection reset instead (seen once in CI): closed too, no answer."""
    body = {"prompt": "hi", "max_tokens": 1}
    headers = {"Authorization": f"Bearer {GENERATE_B}"}
    statuses: list[int] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            r = httpx.post(served.url + "/v1/completions", json=body, headers=headers, timeout=30)
        except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
            return statuses
        assert r.status_code in (200, 503), r.text
        assert r.status_code == 200 or "SHUTTING_DOWN" in r.text, r.text
        statuses.append(r.status_code)
    raise AssertionError(f"new connections still accepted 10 s after SIGTERM: {statuses}")


def test_sigterm_lets_a_running_stream_finish(served):
    """Last (it stops the module's server): on SIGTERM the HTTP front stops
    with gRPC: new connections are refused while a stream running then is
    served to its end within the grace, not cut; the process exits 0."""
    body = {
        "prompt": "hello",
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {GENERATE}"}
    events = []
    with httpx.stream(
        "POST", served.url + "/v1/completions", json=body, headers=headers, timeout=120
    ) as answer:
        lines = answer.iter_lines()
        events.append(next(line for line in lines if line.startswith("data:")))
        served.proc.proc.send_signal(signal.SIGTERM)
        refused_after = _refused_while_it_stops(served)
        events += [line for line in lines if line.startswith("data:")]
    assert events[-1] == "data: [DONE]"
    usage = json.loads(events[-2].removeprefix("data: "))["usage"]
    assert usage["completion_tokens"] == 1500
    assert served.proc.proc.wait(60) == 0
    print(f"answered before the refusal: {refused_after}")
