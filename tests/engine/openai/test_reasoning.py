"""--reasoning-parser on the HTTP front (rollout_service/http/reasoning.py,
docs/openai.md "Reasoning"), on a real engine serving a model that thinks
(tests/support/think_model.py: greedy, it samples `The rain </think> river
green <tool_call>{...}</tool_call>` after the prompt's `<think>`), with
vLLM's deepseek_r1 reasoning parser and hermes tool parser: the split
checked against the ids the engine sampled, decoded here; streamed pieces
joining to the same; tool calls read from the content only; include_reasoning
false; and a session's URL matching a returned message sent back with its
reasoning, without it, or with other reasoning (refused)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from tests.support.think_model import CALL_JSON, END_THINK, TOOL_OPEN

USER = {"role": "user", "content": "Is it raining?"}
GREEDY = {"temperature": 0, "max_tokens": 32}
IDS = {"return_token_ids": True}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def url(reasoning_server) -> str:
    return f"http://{reasoning_server.http_target}"


@pytest.fixture(scope="module")
def sdk(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tok(reasoning_server):
    return AutoTokenizer.from_pretrained(reasoning_server.model)


@pytest.fixture(scope="module")
def model(sdk) -> str:
    return sdk.models.list().data[0].id


def _split(tok, ids: list[int]) -> tuple[str, str]:
    """The sampled ids' reasoning and content, decoded here: before and after </think>."""
    end = ids.index(tok.convert_tokens_to_ids(END_THINK))
    decode = lambda part: tok.decode(part, skip_special_tokens=True)  # noqa: E731
    return decode(ids[:end]), decode(ids[end + 1 :])


def _joined(chunks) -> tuple[str, str, list[int], list]:
    """A stream's reasoning, content, token ids and tool-call deltas, joined."""
    thought, content, ids, calls = [], [], [], []
    for chunk in chunks:
        for choice in chunk.choices:
            d = choice.delta
            thought.append((d.model_extra or {}).get("reasoning") or "")
            content.append(d.content or "")
            ids.extend(choice.model_extra.get("token_ids") or [])
            calls.extend(d.tool_calls or [])
    return "".join(thought), "".join(content), ids, calls


def test_the_reasoning_is_split_from_the_content_it_sampled(sdk, tok, model):
    r = sdk.chat.completions.create(
        model=model, messages=[USER], **GREEDY, logprobs=True, extra_body=IDS
    )
    [choice] = r.choices
    ids = choice.model_extra["token_ids"]
    reasoning, content = _split(tok, ids)
    assert reasoning == "The rain"
    assert content.startswith(" river green" + TOOL_OPEN + CALL_JSON)
    assert choice.message.model_extra["reasoning"] == reasoning
    assert choice.message.content == content
    assert choice.finish_reason == "stop"
    # Ids and logprobs cover every sampled token, the reasoning's and </think> included.
    assert len(choice.logprobs.content) == len(ids) == r.usage.completion_tokens


def test_streamed_pieces_join_to_the_same_split(sdk, tok, model):
    whole = sdk.chat.completions.create(model=model, messages=[USER], **GREEDY, extra_body=IDS)
    stream = sdk.chat.completions.create(
        model=model, messages=[USER], **GREEDY, stream=True, extra_body=IDS
    )
    reasoning, content, ids, _ = _joined(stream)
    assert ids == whole.choices[0].model_extra["token_ids"]
    assert (reasoning, content) == _split(tok, ids)
    assert reasoning == whole.choices[0].message.model_extra["reasoning"]
    assert content == whole.choices[0].message.content


def test_no_end_token_is_all_reasoning(sdk, tok, model):
    r = sdk.chat.completions.create(
        model=model, messages=[USER], temperature=0, max_tokens=2, extra_body=IDS
    )
    [choice] = r.choices
    assert choice.message.model_extra["reasoning"] == tok.decode(choice.model_extra["token_ids"])
    assert choice.message.content is None and choice.finish_reason == "length"


def test_tool_calls_are_read_from_the_content_only(sdk, tok, model):
    r = sdk.chat.completions.create(
        model=model, messages=[USER], tools=TOOLS, **GREEDY, extra_body=IDS
    )
    [choice] = r.choices
    reasoning, _ = _split(tok, choice.model_extra["token_ids"])
    assert choice.message.model_extra["reasoning"] == reasoning == "The rain"
    [call] = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_time",
        {"zone": "utc"},
    )
    assert TOOL_OPEN not in (choice.message.content or "") and choice.finish_reason == "tool_calls"
    stream = sdk.chat.completions.create(
        model=model, messages=[USER], tools=TOOLS, **GREEDY, stream=True, extra_body=IDS
    )
    thought, content, ids, calls = _joined(stream)
    assert thought == reasoning and ids == choice.model_extra["token_ids"]
    assert TOOL_OPEN not in content and calls and calls[0].function.name == "get_time"


def test_include_reasoning_false_drops_it_and_keeps_the_ids(sdk, tok, model):
    hidden = {**IDS, "include_reasoning": False}
    r = sdk.chat.completions.create(model=model, messages=[USER], **GREEDY, extra_body=hidden)
    [choice] = r.choices
    ids = choice.model_extra["token_ids"]
    assert choice.message.model_extra.get("reasoning") is None
    assert choice.message.content == _split(tok, ids)[1]
    stream = sdk.chat.completions.create(
        model=model, messages=[USER], **GREEDY, stream=True, extra_body=hidden
    )
    reasoning, content, streamed_ids, _ = _joined(stream)
    assert reasoning == "" and content == _split(tok, ids)[1] and streamed_ids == ids
    # With a structured output vLLM would constrain from the first token: refused.
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(
            model=model,
            messages=[USER],
            **GREEDY,
            response_format={"type": "json_object"},
            extra_body={"include_reasoning": False},
        )
    assert refused.value.body["param"] == "include_reasoning"


def _open(url: str) -> openai.OpenAI:
    opened = httpx.post(url + "/sessions", json={"messages": [USER]}, timeout=60)
    assert opened.status_code == 200, opened.text
    return openai.OpenAI(
        base_url=opened.json()["base_url"], api_key="unused", max_retries=0, timeout=120
    )


@pytest.mark.parametrize("echo", ["as_returned", "stripped", "reasoning_content"])
def test_a_session_matches_a_returned_message_with_or_without_its_reasoning(url, tok, echo, model):
    agent = _open(url)
    first = agent.chat.completions.create(model=model, messages=[USER], **GREEDY, extra_body=IDS)
    sampled = first.choices[0].model_extra["token_ids"]
    message = first.choices[0].message.model_dump(exclude_none=True)
    assert message["reasoning"] == "The rain"
    if echo == "stripped":
        del message["reasoning"]
    elif echo == "reasoning_content":
        message["reasoning_content"] = message.pop("reasoning")
    follow = {"role": "user", "content": "And now?"}
    second = agent.chat.completions.create(
        model=model, messages=[USER, message, follow], **GREEDY, extra_body=IDS
    )
    # The next turn follows the ids the first sampled, reasoning and all: never re-tokenized.
    prompt = second.model_extra["prompt_token_ids"]
    start = first.model_extra["prompt_token_ids"]
    assert prompt[: len(start) + len(sampled)] == start + sampled
    assert second.choices[0].message.model_extra["reasoning"] == "The rain"


def test_a_session_refuses_other_reasoning_than_it_sampled(url, model):
    agent = _open(url)
    first = agent.chat.completions.create(model=model, messages=[USER], **GREEDY)
    message = first.choices[0].message.model_dump(exclude_none=True)
    assert message["reasoning"] == "The rain"
    message["reasoning"] = "Something else"
    with pytest.raises(openai.BadRequestError) as refused:
        agent.chat.completions.create(
            model=model, messages=[USER, message, {"role": "user", "content": "?"}], **GREEDY
        )
    assert refused.value.body["code"] == "HISTORY_DIVERGED"
    assert refused.value.body["param"] == "messages[1]"
    assert "reasoning" in refused.value.body["message"]
