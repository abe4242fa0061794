"""OpenSession, shared by the gRPC handler (rpc/session_rpcs.py) and the
HTTP route that opens a session (http/session_routes.py): the session counted
against every limit before any tokenizing, its prompt (or resumed history)
held on the tokenizing thread, then open."""

from __future__ import annotations

from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.sessions import resuming
from rollout_service.sessions.opening import budget_of, open_prompt
from rollout_service.sessions.store import Session
from rollout_service.status import static_rules
from rollout_service.status.errors import InvalidArgument

_ISOLATED = pb.APPEND_RENDER_ISOLATED


def _hold(session: Session, request: pb.OpenSessionRequest, limits, tok) -> list[int]:
    """On the tokenizing thread: the prompt (or the resumed history) into
    the new session."""
    if request.HasField("resume"):
        if request.prompt_token_ids or request.prompt_text or request.messages:
            raise InvalidArgument("resume", "re-opens a history: set no prompt field with it")
        return resuming.resume(session, request, limits, request.append_render != _ISOLATED)
    prompt = open_prompt(request, limits, tok, session.budget)
    session.trajectory.append(pb.TOKEN_SOURCE_PROMPT, prompt.ids, prompt.conversation)
    session.opened_with(prompt.conversation, request.append_render != _ISOLATED, prompt.text_bytes)
    session.tools = prompt.tools
    if prompt.conversation is not None:
        # What the session's base URL matches a chat's messages against.
        session.chat_history = [dict(m) for m in prompt.conversation]
    return prompt.ids


async def open_session(
    app: Any, session_id: str, owner: str, request: pb.OpenSessionRequest
) -> tuple[Session, pb.OpenSessionResponse]:
    """Opens `session_id` (from SessionIds.issue) for `owner` (auth.Caller's);
    the response has no base_url (the front that answers knows it)."""
    app.served.check_serving()
    if request.lora_adapter:
        app.adapters.check_known(request.lora_adapter)
    static_rules.check(request)
    limits = app.info.limits
    budget = budget_of(request, limits)
    # Counted before any tokenizing: a caller at its limit costs nothing.
    session = app.session_store.new(
        session_id,
        owner,
        budget,
        lora_adapter=request.lora_adapter,
        pinned_version=app.served.version if request.pin_weight_version else "",
        history_rule=request.history_rule or pb.HISTORY_RULE_REFUSE,
    )
    try:
        ids = await app.tokenizing.off_loop(_hold, session, request, limits, app.tokenizing)
    except BaseException:
        app.session_store.release(session)
        raise
    app.session_store.add(session)
    return session, pb.OpenSessionResponse(
        session_id=session.id,
        prompt_token_ids=ids,
        weight_version=app.served.version,
        max_total_tokens=budget,
        idle_timeout_seconds=app.session_store.limits.idle_timeout_seconds,
    )
