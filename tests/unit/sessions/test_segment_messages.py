"""The chat messages a session's segments were rendered from, without an
engine: gRPC ChatMessages with tool calls become the conversation entries a
template renders and come back as ChatMessages that render the same
(GetSession's `include_messages`, a resume's `messages`), tool call
arguments nested past the JSON bound are refused naming them, and a
session's message text counts every segment's, a restart's included."""

from __future__ import annotations

import pytest

from rollout_client import pb
from rollout_client.calls import core
from rollout_service.engine.limits import ModelLimits
from rollout_service.generation.chat_entries import chat_message
from rollout_service.generation.tokenizing import conversation_of
from rollout_service.http.session_history import conversation_entry
from rollout_service.sessions import appends
from rollout_service.sessions.opening import text_bytes
from rollout_service.sessions.store import TEXT_BYTES_PER_TOKEN, Session
from rollout_service.sessions.trajectory import messages_to_proto
from rollout_service.status.errors import FailedPrecondition, InvalidArgument

CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": [1, 2]}'}}
CHAT = [
    {"role": "user", "content": "Add."},
    {"role": "assistant", "content": None, "tool_calls": [CALL], "reasoning": "Sum them."},
    {"role": "tool", "content": "3", "tool_call_id": "c1"},
]


def _entries(messages):
    return conversation_of(core.chat_messages(messages), "messages")[1]


def test_tool_calls_become_the_entries_a_template_renders():
    user, assistant, tool = _entries(CHAT)
    assert user == {"role": "user", "content": "Add."}
    assert assistant == {
        "role": "assistant",
        "content": "",
        "reasoning": "Sum them.",
        "reasoning_content": "Sum them.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "add", "arguments": {"a": [1, 2]}},
            }
        ],
    }
    assert tool == {"role": "tool", "content": "3", "tool_call_id": "c1"}


@pytest.mark.parametrize("arguments", ['{"a": [1, 2]}', "not json", '"123"', "[]", "NaN"])
def test_entries_come_back_as_chat_messages_that_make_the_same_entries(arguments):
    call = {"id": "", "type": "function", "function": {"name": "f", "arguments": arguments}}
    entries = _entries([{"role": "assistant", "content": "x", "tool_calls": [call]}])
    again = conversation_of([chat_message(e) for e in entries], "messages")[1]
    assert again == entries


def test_the_http_fronts_entries_come_back_the_same_too():
    entries = [conversation_entry(m, f"messages[{i}]") for i, m in enumerate(CHAT)]
    out = pb.GetSessionResponse()
    session = Session(id="s", owner="", budget=100)
    session.trajectory.append(pb.TOKEN_SOURCE_PROMPT, [1]).messages = entries
    session.trajectory.begin_turn()
    messages_to_proto(session.trajectory.segments, out)
    assert len(out.messages) == 2 and not out.messages[1].messages
    assert conversation_of(out.messages[0].messages, "messages")[1] == entries


@pytest.mark.parametrize("front", ["grpc", "http"])
def test_arguments_nested_past_the_bound_are_refused_naming_them(front):
    deep = {"function": {"name": "f", "arguments": "[" * 100_000}}
    message = {"role": "assistant", "content": "", "tool_calls": [deep]}
    convert = _entries if front == "grpc" else lambda ms: conversation_entry(ms[0], "messages[0]")
    with pytest.raises(InvalidArgument) as e:
        convert([message])
    assert e.value.message.startswith("messages[0].tool_calls[0]")
    assert "deeper than 64 levels" in e.value.message


def test_the_text_of_tool_calls_counts():
    [plain] = _entries([{"role": "assistant", "content": ""}])
    [called] = _entries([{"role": "assistant", "content": "", "tool_calls": [CALL]}])
    assert text_bytes([called]) == text_bytes([plain]) + len("add") + len('{"a": [1, 2]}')


class _Tok:
    """Renders a conversation as its contents, one token a character."""

    def render_conversation(self, conversation, field, gen, tools=None):
        return "".join(m["content"] for m in conversation)

    def encode(self, text, field, add_special_tokens=False):
        return [1] * len(text)


def test_a_restart_counts_its_conversation_beside_what_the_earlier_segments_hold():
    budget = 100
    s = Session(id="s", owner="", budget=budget)
    opening = [{"role": "user", "content": "x" * 10}]
    s.trajectory.append(pb.TOKEN_SOURCE_PROMPT, [1] * 10).messages = opening
    s.opened_with(opening, True, text_bytes(opening))
    held = s.text_bytes
    # Fits alone in what a session may hold, not beside what it holds.
    room = TEXT_BYTES_PER_TOKEN * budget
    big = [{"role": "user", "content": "y" * (room - len("user") - held + 1)}]
    limits = ModelLimits(
        vocab_size=512, max_model_len=10**9, max_logprobs=20, supports_images=False
    )
    with pytest.raises(FailedPrecondition):
        appends.restart(s, big, limits, _Tok())
    assert len(s.trajectory.segments) == 1 and s.text_bytes == held
    small = [{"role": "user", "content": "z" * 20}]
    appends.restart(s, small, limits, _Tok())
    assert s.trajectory.segments[-1].messages is small
    assert s.text_bytes == held + text_bytes(small)
