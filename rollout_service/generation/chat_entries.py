"""A chat message's tool fields and reasoning both ways between rollout.v1's ChatMessage
and the Hugging Face conversation entry a chat template renders (OpenAI's
shape: `tool_calls: [{"id", "type": "function", "function": {"name",
"arguments"}}]`, `tool_call_id`).

Arguments are handed to the template as a JSON value (templates render them
with `tojson`), or as the text itself when it is not JSON (a model may
write that); back to a ChatMessage they are JSON text, so a message read
from a session (GetSession) and sent again (a resume) renders the same.
"""

from __future__ import annotations

import json
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.generation.json_input import load_loose


def tool_call_entry(name: str, arguments: Any, field: str, call_id: str = "") -> dict[str, Any]:
    """One tool call as the entry's `tool_calls` holds it; `arguments` as a
    JSON value (text that does not parse stays text; InvalidArgument naming
    `field` when nested past the JSON bound)."""
    value = load_loose(arguments, field) if isinstance(arguments, str) else arguments
    entry: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": value}}
    if call_id:
        entry["id"] = call_id
    return entry


def with_reasoning(entry: dict[str, Any], reasoning: str) -> dict[str, Any]:
    """`entry` with its reasoning under both names, as vLLM's renderer gives
    it to the chat template (none: unchanged)."""
    if reasoning:
        entry["reasoning"] = entry["reasoning_content"] = reasoning
    return entry


def tool_fields(m: pb.ChatMessage, field: str) -> dict[str, Any]:
    """`m`'s tool calls, tool_call_id and reasoning as entry fields (none: {})."""
    out: dict[str, Any] = {}
    calls = [
        tool_call_entry(call.name, call.arguments, f"{field}.tool_calls[{k}].arguments", call.id)
        for k, call in enumerate(m.tool_calls)
    ]
    if calls:
        out["tool_calls"] = calls
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    return with_reasoning(out, m.reasoning)


def chat_message(entry: dict[str, Any]) -> pb.ChatMessage:
    """A text conversation entry (a session holds its messages so) as a
    ChatMessage that renders the same."""
    m = pb.ChatMessage(
        role=entry["role"],
        tool_call_id=entry.get("tool_call_id", ""),
        reasoning=entry.get("reasoning") or "",
    )
    if entry.get("content"):
        m.content.add(text=entry["content"])
    for call in entry.get("tool_calls") or ():
        function = call["function"]
        m.tool_calls.add(
            id=str(call.get("id") or ""),
            name=function["name"],
            arguments=json.dumps(function["arguments"], ensure_ascii=False),
        )
    return m
