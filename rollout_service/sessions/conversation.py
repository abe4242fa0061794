"""What a session's chat template renders after its history: an append's
bridge and messages, or a turn's generation prompt (rendering.py's rule,
over the session's own conversation or the isolated stand-in).

Runs on the tokenizing thread: rendering and decoding grow with the history.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.sessions import rendering
from rollout_service.sessions.store import Session
from rollout_service.sessions.trajectory import Segment


def _history(session: Session, tok) -> tuple[list[dict[str, Any]], bool]:
    """The conversation to render after, and whether a model turn came last."""
    last = session.trajectory.last
    last_is_turn = last is not None and last.source == pb.TOKEN_SOURCE_SAMPLED
    if session.conversation is None:
        return rendering.stand_in(last_is_turn), last_is_turn
    history = []
    for entry in session.conversation:
        if isinstance(entry, Segment):
            ids = session.trajectory.turn_tokens(entry)
            entry = {"role": "assistant", "content": tok.decode(ids, skip_special_tokens=True)}
        history.append(entry)
    return history, last_is_turn


def rendered_ids(
    session: Session, tok, new: Sequence[dict[str, Any]], add_generation_prompt: bool
) -> list[int]:
    """The ids the template renders after the held history for `new` (and
    the generation prompt), tokenized alone; a stop token the last turn
    sampled is not repeated."""

    def render(conversation: list[dict[str, Any]], gen: bool) -> str:
        return tok.render_conversation(conversation, "messages", gen, tools=session.tools)

    history, last_is_turn = _history(session, tok)
    text = rendering.bridge(render, history, last_is_turn, new, add_generation_prompt)
    ids = tok.encode(text, "messages", add_special_tokens=False) if text else []
    last = session.trajectory.last
    return rendering.drop_sampled_stop(ids, last.stop_token if last_is_turn and last else None)
