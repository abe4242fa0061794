"""AppendToSession: the environment's output into a session, on the
tokenizing thread (rendering grows with the history), while the session is
held for this call alone (store.using)."""

from __future__ import annotations

from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.engine.limits import ModelLimits
from rollout_service.generation import convert
from rollout_service.sessions.conversation import rendered_ids
from rollout_service.sessions.opening import check_text, text_chars, text_conversation
from rollout_service.sessions.store import Session
from rollout_service.status import static_rules
from rollout_service.status.errors import FailedPrecondition, InvalidArgument


def append(
    session: Session, request: pb.AppendToSessionRequest, limits: ModelLimits, tok
) -> list[int]:
    """Appends token ids as they are, or messages as the template renders
    them after the history; refused with nothing changed otherwise."""
    if bool(request.token_ids) == bool(request.messages):
        raise InvalidArgument("token_ids/messages", "exactly one must be set")
    static_rules.check(request)  # the messages' roles and tool fields
    t = session.trajectory
    if request.token_ids:
        ids = list(request.token_ids)
        convert.check_vocabulary(ids, limits.vocab_size, "token_ids")
        session.check_room(len(ids), "token_ids")
        t.append(pb.TOKEN_SOURCE_APPENDED, ids)
        session.appended_ids()
        return ids
    return append_messages(session, text_conversation(request.messages, "messages"), limits, tok)


def append_messages(session: Session, new: list[dict[str, Any]], limits: ModelLimits, tok):
    """Appends messages (a Hugging Face conversation's, text content) as the
    template renders them after the history (the session's base URL calls
    this too); refused with nothing changed otherwise."""
    t = session.trajectory
    nbytes = check_text(new, "messages", session.text_bytes, session.budget)
    if (least := tok.min_tokens(text_chars(new))) > session.remaining:
        raise FailedPrecondition(
            f"messages: at least {least} tokens do not fit the {session.remaining} left of "
            f"the session's budget ({session.budget})",
            reason=pb.ERROR_REASON_SESSION_BUDGET,
        )
    ids = rendered_ids(session, tok, new, add_generation_prompt=False)
    if not ids:
        raise InvalidArgument("messages", "render to no tokens")
    session.check_room(len(ids), "messages")
    t.append(pb.TOKEN_SOURCE_APPENDED, ids, new)
    session.appended_messages(new, nbytes)
    return ids


def restart(session: Session, conversation: list[dict[str, Any]], limits: ModelLimits, tok):
    """A new context (HISTORY_RULE_RESTART): the whole conversation rendered
    as a prompt is (opening.py) and appended as a segment that later turns
    are conditioned on from its start; refused with nothing changed when it
    does not fit."""
    nbytes = check_text(conversation, "messages", session.text_bytes, session.budget)
    text = tok.render_conversation(conversation, "messages", False, tools=session.tools)
    ids = tok.encode(text, "messages", add_special_tokens=False)
    if not ids:
        raise InvalidArgument("messages", "render to no tokens")
    convert.check_prompt_length(len(ids), "messages", limits)
    session.check_room(len(ids), "messages")
    session.trajectory.restart(ids, conversation)
    session.restarted_with(conversation, nbytes)
    return ids
