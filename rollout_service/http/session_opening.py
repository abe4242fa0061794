"""POST /sessions: its JSON body as an OpenSessionRequest, and the opened
session as JSON (session_routes.py). The body, on the tokenizing thread:

    {"messages": [...], "tools": [...], "max_total_tokens": 4096,
     "model": "<a LoRA adapter, or the base model>", "pin_weight_version": false,
     "append_render": "whole" | "isolated", "history_rule": "refuse" | "restart"}

`messages` (OpenAI's, text content) is required: the conversation's start,
which the harness's first chat completion repeats. Tool calls and tool
results come as turns.
"""

from __future__ import annotations

import json
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.http.body import check_lists, parse_json
from rollout_service.http.chat import adapter_of
from rollout_service.http.session_history import conversation_entry
from rollout_service.sessions.store import Session
from rollout_service.status.errors import InvalidArgument, short_repr

RULES: dict[str, int] = {"refuse": pb.HISTORY_RULE_REFUSE, "restart": pb.HISTORY_RULE_RESTART}
RENDERS: dict[str, int] = {"whole": pb.APPEND_RENDER_WHOLE, "isolated": pb.APPEND_RENDER_ISOLATED}
FIELDS = {
    "messages",
    "tools",
    "max_total_tokens",
    "model",
    "pin_weight_version",
    "append_render",
    "history_rule",
}


def _choice(data: dict[str, Any], name: str, choices: dict[str, int]) -> int:
    value = data.get(name, next(iter(choices)))
    if value not in choices:
        raise InvalidArgument(name, f"one of {', '.join(map(repr, choices))}")
    return choices[value]


def open_request(raw: bytes, front, app) -> pb.OpenSessionRequest:
    """The body as OpenSession's request; 400 naming the field at fault."""
    data = parse_json(raw)
    check_lists(data)
    for key in data:
        if key not in FIELDS:
            raise InvalidArgument(short_repr(key).strip("'"), "is not a field of this request")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidArgument("messages", "the conversation's first messages, at least one")
    request = pb.OpenSessionRequest(
        history_rule=_choice(data, "history_rule", RULES),  # type: ignore[arg-type]
        append_render=_choice(data, "append_render", RENDERS),  # type: ignore[arg-type]
    )
    for i, m in enumerate(messages):
        entry = conversation_entry(m, f"messages[{i}]")
        if "tool_calls" in entry or "tool_call_id" in entry:
            raise InvalidArgument(
                f"messages[{i}]", "open with the conversation's start: tool calls come as turns"
            )
        part = pb.ContentPart(text=entry["content"])
        request.messages.add(role=entry["role"], content=[part])
    tools = data.get("tools") or []
    if not isinstance(tools, list):
        raise InvalidArgument("tools", "a list of tools")
    request.tools_json.extend(json.dumps(t) for t in tools)
    budget = data.get("max_total_tokens")
    if budget is not None:
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
            raise InvalidArgument("max_total_tokens", "a whole number of tokens")
        request.max_total_tokens = min(budget, 2**32 - 1)
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidArgument("model", "a string")
    request.lora_adapter = adapter_of(model, front, app)
    pin = data.get("pin_weight_version", False)
    if not isinstance(pin, bool):
        raise InvalidArgument("pin_weight_version", "true or false")
    request.pin_weight_version = pin
    return request


def opened(response: pb.OpenSessionResponse, session: Session) -> dict[str, Any]:
    """The opened session as POST /sessions answers it."""
    rule = {v: k for k, v in RULES.items()}[session.history_rule]
    return {
        "id": response.session_id,
        "object": "session",
        "base_url": response.base_url,
        "prompt_token_ids": list(response.prompt_token_ids),
        "weight_version": response.weight_version,
        "max_total_tokens": response.max_total_tokens,
        "idle_timeout_seconds": response.idle_timeout_seconds,
        "history_rule": rule,
    }
