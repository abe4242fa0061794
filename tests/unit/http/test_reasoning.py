"""Engine-free: --reasoning-parser refused at start unless vLLM registered
it; vLLM's reasoning parser splitting a completion before a forced tool call
is read from the content (rollout_service/http/reasoning.py);
include_reasoning false refused with a structured output; and how a
session's held assistant message matches one sent back with its reasoning,
without it, or with other reasoning (http/session_history.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

from rollout.v1 import rollout_pb2 as pb
from rollout_service import cli
from rollout_service.http.chat import ChatCall, chat_settings
from rollout_service.http.front import Front
from rollout_service.http.responses import chat_message
from rollout_service.http.session_history import conversation_entry, diverged, extend
from rollout_service.ops import logs
from rollout_service.status.errors import InvalidArgument
from tests.support.think_model import build_think_model

USER = {"role": "user", "content": "Hi"}
TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


def test_an_unknown_reasoning_parser_is_refused_at_start_naming_the_choices(monkeypatch, capsys):
    monkeypatch.setattr(logs, "configure", lambda json_lines: None)  # pytest's handlers stay
    with pytest.raises(SystemExit) as refused:
        cli._serve(["serve", "--reasoning-parser", "no_such_parser"])
    said = str(refused.value.code)
    assert "--reasoning-parser no_such_parser: not one of vLLM's reasoning parsers" in said
    assert "deepseek_r1" in said and "qwen3" in said


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """What the response builders read of an App: the think model's tokenizer."""
    from transformers import AutoTokenizer

    folder = build_think_model(tmp_path_factory.mktemp("think"))
    return SimpleNamespace(
        tokenizing=SimpleNamespace(tokenizer=AutoTokenizer.from_pretrained(folder)),
        engine=SimpleNamespace(model_config=SimpleNamespace(model=str(folder))),
    )


def _front() -> Front:
    return Front(ready=lambda: None, tokens=None, reasoning_parser="deepseek_r1")


def _call(app, **body) -> ChatCall:
    request = ChatCompletionRequest.model_validate({"messages": [USER], **body})
    parser_cls, reasoning_cls, _ = chat_settings(request, _front(), app)
    return ChatCall(request, pb.GenerateRequest(), [], parser_cls, reasoning_cls)


def test_a_forced_call_is_read_from_the_content_after_the_reasoning(app):
    named = {"type": "function", "function": {"name": "get_time"}}
    call = _call(app, tools=[TOOL], tool_choice=named)
    text = 'The rain</think>{"zone": "utc"}'
    message, called = chat_message(call, pb.Completion(text=text), app)
    assert message.reasoning == "The rain" and called
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("get_time", '{"zone": "utc"}')
    ]
    plain = chat_message(_call(app), pb.Completion(text="The rain</think> river"), app)[0]
    assert (plain.reasoning, plain.content) == ("The rain", " river")
    hidden = _call(app, include_reasoning=False)
    message, _ = chat_message(hidden, pb.Completion(text="The rain</think> river"), app)
    assert (message.reasoning, message.content) == (None, " river")


def test_hidden_reasoning_with_a_structured_output_is_refused(app):
    request = ChatCompletionRequest.model_validate(
        {"messages": [USER], "include_reasoning": False, "response_format": {"type": "json_object"}}
    )
    with pytest.raises(InvalidArgument) as refused:
        chat_settings(request, _front(), app)
    assert refused.value.field == "include_reasoning"
    # Without a reasoning parser there is nothing to hide: served.
    chat_settings(request, Front(ready=lambda: None, tokens=None), app)


def test_a_held_message_matches_with_its_reasoning_or_without_it():
    sampled = {"role": "assistant", "content": " river", "reasoning": "The rain"}
    held = [conversation_entry(m, "m") for m in (USER, sampled)]
    follow = {"role": "user", "content": "And?"}
    stripped = {"role": "assistant", "content": " river"}
    older = {"role": "assistant", "content": " river", "reasoning_content": "The rain"}
    for sent in (sampled, stripped, older):
        ext = extend(held, [conversation_entry(m, "m") for m in (USER, sent, follow)])
        assert ext.diverged is None and ext.new == [conversation_entry(follow, "m")]
    other = {**sampled, "reasoning": "Something else"}
    messages = [conversation_entry(m, "m") for m in (USER, other, follow)]
    assert extend(held, messages).diverged == 1
    renamed = {**older, "reasoning_content": "Something else"}
    assert extend(held, [conversation_entry(m, "m") for m in (USER, renamed)]).diverged == 1
    refusal = diverged(1, held, messages)
    assert refusal.field == "messages[1]" and "other reasoning" in str(refusal)
    # A message the session holds without reasoning is not matched by one with some.
    plain = [conversation_entry(m, "m") for m in (USER, stripped)]
    assert extend(plain, [conversation_entry(m, "m") for m in (USER, sampled)]).diverged == 1


def test_reasoning_is_a_string():
    with pytest.raises(InvalidArgument) as refused:
        conversation_entry({"role": "assistant", "content": "", "reasoning": 3}, "messages[1]")
    assert refused.value.field == "messages[1].reasoning"


def test_a_reasoning_parser_the_tokenizer_cannot_serve_is_refused_before_the_engine(
    monkeypatch,
):
    """The embedded model's tokenizer has no think tokens: deepseek_r1 is
    refused at start, naming the flag and why, and no server starts."""
    from rollout_service import server

    monkeypatch.setattr(logs, "configure", lambda json_lines: None)

    async def started(*args):
        raise AssertionError("the server started")

    monkeypatch.setattr(server, "serve", started)
    with pytest.raises(SystemExit) as refused:
        cli._serve(["serve", "--reasoning-parser", "deepseek_r1"])
    said = str(refused.value.code)
    assert "--reasoning-parser deepseek_r1 cannot be used with the tokenizer" in said, said
    assert "think start/end tokens" in said
