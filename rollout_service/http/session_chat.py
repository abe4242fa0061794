"""A chat completion on a session's base URL, up to the session and back
(session_routes.py runs them): the body parsed as /v1/chat/completions
parses it (chat.py's fields, sampling and tool forcing), its messages as
conversation entries; then, with the session held, the new messages
appended by its template rule (or the history's rule applied); after the
turn, the answer as the whole turn (an interrupted turn that this call
resumed included) and the assistant message the session now holds.
The functions that grow with the request run on the tokenizing thread."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.http import reasoning, sampling
from rollout_service.http.body import check_lists, parse_json, validated
from rollout_service.http.chat import CHAT_FIELDS, ChatCall, chat_settings, required_version
from rollout_service.http.session_history import (
    Message,
    adopt,
    conversation_entry,
    diverged,
    extend,
)
from rollout_service.sessions import appends
from rollout_service.sessions.store import Session
from rollout_service.status.errors import FailedPrecondition, InvalidArgument

# What a session fixes for every turn: its prompt's rendering (the template's
# options), its one sample, its adapter; prompt logprobs are GetSession's.
SESSION_FIELDS = CHAT_FIELDS - {
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "prompt_logprobs",
}


@dataclass
class SessionChat:
    """A parsed chat completion for a session: the ChatCall the response
    builders take (its prompt_ids filled in once the turn is planned), and
    the request's messages as conversation entries."""

    call: ChatCall
    messages: list[Message]

    def turn(self) -> pb.SessionGenerateRequest:
        g = self.call.generate
        return pb.SessionGenerateRequest(
            request_id=g.request_id,
            sampling_params=g.sampling_params,
            required_weight_version=g.required_weight_version,
        )


def _tool_key(tool: Any) -> list:
    """A tool as the template renders it: its function's name, description
    and parameters (a harness's serializer may add or drop empty fields)."""
    f = tool.get("function", {}) if isinstance(tool, dict) else {}
    return [f.get("name"), f.get("description") or "", f.get("parameters") or {}]


def prepare(raw: bytes, front, app, session: Session) -> SessionChat:
    """The body, or InvalidArgument naming what is wrong."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    data = parse_json(raw)
    check_lists(data)
    request: Any = validated(ChatCompletionRequest, data)
    sampling.refuse_unsupported(request, SESSION_FIELDS)
    if data.get("tools") and json.dumps([_tool_key(t) for t in data["tools"]]) != json.dumps(
        [_tool_key(t) for t in session.tools or ()]
    ):
        raise InvalidArgument(
            "tools", "differ from the tools the session was opened with (its prompt renders those)"
        )
    parser_cls, reasoning_cls, params = chat_settings(request, front, app)
    generate = pb.GenerateRequest(
        request_id=request.request_id,
        sampling_params=params,
        required_weight_version=required_version(data),
    )
    messages = [conversation_entry(m, f"messages[{i}]") for i, m in enumerate(data["messages"])]
    return SessionChat(ChatCall(request, generate, [], parser_cls, reasoning_cls), messages)


def extend_session(session: Session, messages: list[Message], limits, tok) -> None:
    """With the session held (store.using): appends what is new in
    `messages`, or applies the session's history rule; nothing changes
    when it refuses."""
    held = session.chat_history
    if held is None and session.resumed_prompt is not None:
        segments = session.trajectory.segments
        # From the context the session was re-opened in: its prompt, or its
        # last restart (whose messages resumed_prompt then holds).
        k = max((i for i, g in enumerate(segments) if g.restarts_context), default=0)
        adopted, refused = adopt(session.resumed_prompt, segments[k:], messages)
        if refused is not None:
            _refuse_or_restart(session, refused, messages, limits, tok)
            return
        held = session.chat_history = adopted
        session.resumed_prompt = None
    if held is None:
        raise FailedPrecondition(
            "messages: this session has no conversation a chat can extend (it was opened "
            "with token ids or text); open it with messages",
            reason=pb.ERROR_REASON_HISTORY_DIVERGED,
        )
    ext = extend(held, messages)
    if ext.diverged is not None:
        _refuse_or_restart(session, diverged(ext.diverged, held, messages), messages, limits, tok)
    elif ext.new:
        appends.append_messages(session, ext.new, limits, tok)
        held.extend(ext.new)


def _refuse_or_restart(
    session: Session, refusal: Exception, messages: list[Message], limits, tok
) -> None:
    """A history that does not extend the held one, by the session's rule:
    `refusal` raised (nothing changed), or a new context from `messages`."""
    if session.history_rule != pb.HISTORY_RULE_RESTART:
        raise refusal
    appends.restart(session, messages, limits, tok)
    session.chat_history = list(messages)
    session.resumed_prompt = None


@dataclass(frozen=True)
class Partial:
    """An interrupted turn the next one resumes: its tokens so far."""

    ids: list[int]
    logprobs: list[float]


def interrupted(session: Session) -> Partial | None:
    """The turn the next one resumes (the session's last, interrupted), if any."""
    t = session.trajectory
    last = t.last
    if last is None or not last.interrupted:
        return None
    end = last.start + last.count
    return Partial(t.turn_tokens(last), t.logprobs[last.start : end].tolist())


def finish_reason(reason: int) -> int:
    """A turn's finish reason as OpenAI's can say it: the session's budget
    ending the turn is "length" (GetSession's segment says BUDGET)."""
    return pb.FINISH_REASON_LENGTH if reason == pb.FINISH_REASON_BUDGET else reason


def whole_turn(
    chat: SessionChat,
    answer: pb.SessionGenerateResponse,
    partial: Partial | None,
    session: Session,
    app,
) -> pb.GenerateResponse:
    """The turn's answer as a GenerateResponse for chat_response: the
    completion with what a resumed turn held before (the message is the
    whole turn), the call's prompt_ids the ids the turn followed (from its
    context's start: the generation prompt included, the resumed turn's own
    earlier tokens not)."""
    c = pb.Completion()
    c.CopyFrom(answer.completion)
    c.finish_reason = finish_reason(c.finish_reason)  # type: ignore[assignment]
    if partial is not None and partial.ids:
        ids = partial.ids + list(c.token_ids)
        del c.token_ids[:], c.logprobs[:], c.top_logprobs[:]
        c.token_ids.extend(ids)
        c.logprobs.extend(partial.logprobs + list(answer.completion.logprobs))
        # No alternatives are held for the earlier tokens.
        c.top_logprobs.extend([pb.TopLogprobs() for _ in partial.ids])
        c.top_logprobs.extend(answer.completion.top_logprobs)
        c.text = app.tokenizing.decode(ids, True)
    t = session.trajectory
    if c.token_ids:
        seg = t.segments[answer.state.segment_index]
        chat.call.prompt_ids = t.ids[t.context_start : seg.start].tolist()
    else:
        chat.call.prompt_ids = t.context()
    return pb.GenerateResponse(
        request_id=answer.request_id,
        completions=[c],
        weight_version=answer.weight_version,
        usage=answer.usage,
    )


def held_message(chat: SessionChat, text: str, ids: list[int], app) -> Message:
    """The assistant message a turn answered with, as the session holds it:
    its reasoning kept even when the answer dropped it (include_reasoning
    false), for a harness that sends it back."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatMessage

    thought, content, calls = reasoning.parsed(chat.call, text, ids, app)
    message = ChatMessage(role="assistant", content=content, reasoning=thought, tool_calls=calls)
    return conversation_entry(message.model_dump(), "message")


def record(session: Session, entry: Message, resumed: bool) -> None:
    """The answered message into the session's chat history; a resumed turn's
    replaces the interrupted one's, when that one was answered."""
    held = session.chat_history
    if held is None:
        return
    if resumed and held and held[-1]["role"] == "assistant":
        held[-1] = entry
    else:
        held.append(entry)
