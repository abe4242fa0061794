"""Which of a chat's messages a session already holds (its base URL,
session_routes.py). Pure: tested without an engine.

A session keeps the OpenAI messages its base URL has seen, as Hugging Face
conversation entries (`Session.chat_history`): the messages it opened with,
each message appended, each assistant message it answered with as it was
returned. A request's `messages` extend them when they start with them,
compared by position on what a harness keeps of a message (`same`): the
role, the content's text, the tool calls' names and arguments (as JSON
values: a harness may re-serialize them) and a tool result's tool_call_id.
Tool call ids the server made, and fields a harness adds or drops
(`refusal`, `annotations`, `name`), are not compared. An assistant
message's reasoning (`reasoning`, or vLLM's older `reasoning_content`;
--reasoning-parser split it off the content) is compared when the harness
sends it back, and may be left out: reasoning harnesses strip it. Either
way the session keeps the ids it sampled, the reasoning's included. The
messages after the held ones are new: the session appends them by its
template rule, then samples the turn. Anything else diverges at its first
differing message.

A session re-opened from a history (a Fleet moving it off a lost replica)
knows the messages it opened with but not those its old URL saw: its first
chat's messages are adopted (`adopt`) up to the assistant message of its
last answered turn, on the caller's word, as the resumed tokens are.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.generation.chat_entries import tool_call_entry, with_reasoning
from rollout_service.sessions.trajectory import Segment
from rollout_service.status.errors import FailedPrecondition, InvalidArgument

Message = dict[str, Any]
_SAMPLED = pb.TOKEN_SOURCE_SAMPLED
_APPENDED = pb.TOKEN_SOURCE_APPENDED


def text_of(content: Any, field: str) -> str:
    """A message's content as text: a string, parts of text, or none."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise InvalidArgument(f"{field}.content[{j}]", "sessions take text parts only")
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise InvalidArgument(f"{field}.content", "a string or a list of text parts")


def conversation_entry(m: Any, field: str) -> Message:
    """An OpenAI chat message (a dict, as vLLM's request holds it) as the
    Hugging Face conversation entry the session's template renders."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not m["role"]:
        raise InvalidArgument(f"{field}.role", "every message has a role")
    entry: Message = {"role": m["role"], "content": text_of(m.get("content"), field)}
    calls = []
    for k, call in enumerate(m.get("tool_calls") or ()):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidArgument(f"{field}.tool_calls[{k}].function", "a name and arguments")
        arguments = function.get("arguments", "")
        at = f"{field}.tool_calls[{k}].function.arguments"
        calls.append(tool_call_entry(function["name"], arguments, at))
    if calls:
        entry["tool_calls"] = calls
    if m.get("tool_call_id"):
        entry["tool_call_id"] = str(m["tool_call_id"])
    thought = m.get("reasoning")
    if thought is None:
        thought = m.get("reasoning_content")
    if thought is not None and m["role"] == "assistant":
        if not isinstance(thought, str):
            raise InvalidArgument(f"{field}.reasoning", "a string")
        with_reasoning(entry, thought)
    return entry


def normal(entry: Message) -> tuple:
    """What two messages must share to be the same message (module docstring)."""
    calls = tuple(
        (c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True))
        for c in entry.get("tool_calls") or ()
    )
    return entry["role"], entry["content"], calls, entry.get("tool_call_id", "")


def same(held: Message, sent: Message) -> bool:
    """Whether `sent` is the message `held` (module docstring): its
    reasoning compared only when it has any."""
    if normal(sent) != normal(held):
        return False
    return not sent.get("reasoning") or sent["reasoning"] == held.get("reasoning")


class HistoryDiverged(FailedPrecondition):
    """A history that does not extend the held one, refused (HTTP 400, its
    param the first differing message)."""

    reason = pb.ERROR_REASON_HISTORY_DIVERGED

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Extension:
    """A request's messages against the held ones: the new ones to append,
    or the index of the first that differs (`diverged`, new then empty)."""

    new: list[Message]
    diverged: int | None = None


def extend(held: list[Message], messages: list[Message]) -> Extension:
    """How `messages` (conversation entries) extend `held`."""
    for i, h in enumerate(held):
        if i >= len(messages) or not same(h, messages[i]):
            return Extension([], i)
    return Extension(messages[len(held) :])


def adopt(
    prompt: list[Message], segments: Sequence[Segment], messages: list[Message]
) -> tuple[list[Message], HistoryDiverged | None]:
    """A resumed session's held messages from its first chat's `messages`:
    the `prompt` it opened with, then each assistant message up to the
    number of answered turns in `segments`, and, when messages were
    appended after the last of those (a call whose turn was lost), every
    message (the agent sends them again). Or HISTORY_RULE_REFUSE's answer
    when they do not line up."""
    for i, p in enumerate(prompt):
        if i >= len(messages) or not same(p, messages[i]):
            return prompt, diverged(i, prompt, messages)
    answered = [k for k, g in enumerate(segments) if g.source == _SAMPLED and not g.interrupted]
    end, seen = len(prompt), 0
    while seen < len(answered):
        if end >= len(messages):
            return prompt, HistoryDiverged(
                f"messages: {seen} assistant messages after the {len(prompt)} the session "
                f"opened with; it was re-opened holding {len(answered)} answered turns. "
                "Nothing changed",
                f"messages[{end}]",
            )
        seen += messages[end]["role"] == "assistant"
        end += 1
    after = segments[answered[-1] + 1 :] if answered else segments[1:]
    if any(g.source == _APPENDED and not g.generation_prompt for g in after):
        end = len(messages)
    return messages[:end], None


def diverged(at: int, held: list[Message], messages: list[Message]) -> HistoryDiverged:
    """HISTORY_RULE_REFUSE's answer: the first differing message, named."""
    if at >= len(messages):
        why = f"is missing: the session holds {len(held)} messages, the request has {len(messages)}"
    else:
        want, got = held[at], messages[at]
        if want["role"] != got["role"]:
            why = f"has role {got['role']!r:.40}; the session holds a {want['role']!r:.40} message"
        elif want["content"] != got["content"]:
            why = "has other content than the message the session holds there"
        elif normal(want) == normal(got):
            why = (
                "has other reasoning than the message the session holds there "
                "(send it as it was returned, or none)"
            )
        else:
            why = "has other tool calls or tool_call_id than the message the session holds there"
    return HistoryDiverged(
        f"messages[{at}] {why}. A session's messages must extend the conversation it holds "
        "(the assistant messages as it returned them); it was opened to refuse other "
        "histories (history_rule), and nothing changed",
        f"messages[{at}]",
    )
