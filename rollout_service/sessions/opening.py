"""OpenSession's prompt and budget: validated, tokenized or rendered once,
on the tokenizing thread, before the session exists."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.engine.limits import ModelLimits
from rollout_service.generation import convert, json_input
from rollout_service.generation.tokenizing import conversation_of
from rollout_service.sessions.store import TEXT_BYTES_PER_TOKEN
from rollout_service.status.errors import FailedPrecondition, InvalidArgument

MAX_TOOLS = 64


@dataclass(frozen=True)
class OpenedPrompt:
    ids: list[int]
    # The messages as a Hugging Face conversation (None: ids or text).
    conversation: list[dict[str, Any]] | None
    tools: list[dict[str, Any]] | None
    text_bytes: int


def budget_of(request: pb.OpenSessionRequest, limits: ModelLimits) -> int:
    """The session's budget: max_total_tokens, at most the model's context."""
    if not request.HasField("max_total_tokens"):
        return limits.max_model_len
    budget = request.max_total_tokens
    if not 2 <= budget <= limits.max_model_len:
        raise InvalidArgument(
            "max_total_tokens",
            f"{budget} is outside [2, {limits.max_model_len}] (the model's context, "
            "max_model_len, holds the whole trajectory)",
        )
    return budget


def text_bytes(conversation: list[dict[str, Any]]) -> int:
    """Bytes of the messages' roles, contents, reasoning and tool fields."""
    n = 0
    for m in conversation:
        n += len(m["role"].encode()) + len(m["content"].encode())
        n += len(m.get("tool_call_id", "").encode()) + len((m.get("reasoning") or "").encode())
        for call in m.get("tool_calls") or ():
            function = call["function"]
            n += len(function["name"].encode()) + len(json.dumps(function["arguments"]).encode())
    return n


def text_chars(conversation: list[dict[str, Any]]) -> int:
    """Characters of roles and contents: the rendered text has at least as many."""
    return sum(len(m["role"]) + len(m["content"]) for m in conversation)


def check_text(conversation: list[dict[str, Any]], field: str, held: int, budget: int) -> int:
    """The messages' text in bytes, refused past what a session may hold."""
    n = text_bytes(conversation)
    if held + n > TEXT_BYTES_PER_TOKEN * budget:
        raise FailedPrecondition(
            f"{field}: {held + n} bytes of message text would pass what the session may "
            f"hold: {TEXT_BYTES_PER_TOKEN} bytes per token of its budget ({budget})",
            reason=pb.ERROR_REASON_SESSION_BUDGET,
        )
    return n


def text_conversation(messages, field: str) -> list[dict[str, Any]]:
    rendered, conversation = conversation_of(messages, field)
    if rendered.images:
        raise InvalidArgument(field, "sessions take text messages only (no images yet)")
    return conversation


def load_tools(request: pb.OpenSessionRequest, chat: bool) -> list[dict[str, Any]] | None:
    """tools_json as objects; `chat`: the prompt is messages."""
    if request.tools_json and not chat:
        raise InvalidArgument("tools_json", "applies to messages only")
    if len(request.tools_json) > MAX_TOOLS:
        raise InvalidArgument("tools_json", f"{len(request.tools_json)} tools, at most {MAX_TOOLS}")
    return [
        json_input.load_object(t, f"tools_json[{i}]", "a tool")
        for i, t in enumerate(request.tools_json)
    ] or None


def open_prompt(
    request: pb.OpenSessionRequest, limits: ModelLimits, tok, budget: int
) -> OpenedPrompt:
    """The prompt's ids (and conversation), refused when it cannot leave one
    token of room in the budget."""
    field = convert.prompt_field(request)
    tools = load_tools(request, field == "messages")
    conversation = None
    held = 0
    if field == "prompt_token_ids":
        ids = list(request.prompt_token_ids)
        convert.check_vocabulary(ids, limits.vocab_size, field)
    elif field == "prompt_text":
        ids = convert.encode_within(tok, request.prompt_text, field, limits)
    else:
        conversation = text_conversation(request.messages, field)
        held = check_text(conversation, field, 0, budget)
        convert.check_prompt_length(
            tok.min_tokens(text_chars(conversation)), field, limits, at_least=True
        )
        text = tok.render_conversation(conversation, field, False, tools=tools)
        ids = tok.encode(text, field, add_special_tokens=False)
    if not ids:
        raise InvalidArgument(field, "makes no tokens")
    convert.check_prompt_length(len(ids), field, limits)
    if len(ids) >= budget:
        raise FailedPrecondition(
            f"{field}: the prompt is {len(ids)} tokens; the session's budget "
            f"(max_total_tokens) of {budget} leaves no room for a generated token",
            reason=pb.ERROR_REASON_SESSION_BUDGET,
        )
    return OpenedPrompt(ids, conversation, tools, held)
