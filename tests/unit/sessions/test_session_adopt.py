"""Engine-free: a session re-opened from a history (a Fleet moving it off a
lost replica) adopts its first chat's messages as the conversation its old
URL held (rollout_service/http/session_history.adopt): the messages it
opened with, then as many assistant messages as it holds answered turns;
what follows is new. Fewer answered turns, or other opening messages, are
refused naming the message."""

from __future__ import annotations

from rollout_client import pb
from rollout_service.http.session_history import adopt
from rollout_service.sessions.trajectory import Segment

USER = {"role": "user", "content": "Plan a trip."}
A1 = {"role": "assistant", "content": "Day one"}
U2 = {"role": "user", "content": "And then?"}
A2 = {"role": "assistant", "content": "Day two"}
U3 = {"role": "user", "content": "Where do we stay?"}


def _segments(*kinds: str) -> list[Segment]:
    """Segments laid end to end: prompt, turn, stopped (an interrupted
    turn), append (messages), gen (a generation prompt)."""
    out, at = [], 0
    for kind in kinds:
        source = {
            "prompt": pb.TOKEN_SOURCE_PROMPT,
            "turn": pb.TOKEN_SOURCE_SAMPLED,
            "stopped": pb.TOKEN_SOURCE_SAMPLED,
        }.get(kind, pb.TOKEN_SOURCE_APPENDED)
        finish = pb.FINISH_REASON_ABORT if kind == "stopped" else pb.FINISH_REASON_LENGTH
        out.append(
            Segment(
                source=source,
                start=at,
                count=3,
                finish_reason=finish if source == pb.TOKEN_SOURCE_SAMPLED else 0,
                generation_prompt=kind == "gen",
            )
        )
        at += 3
    return out


def test_held_up_to_the_last_answered_turn_then_new():
    held = _segments("prompt", "turn", "append", "gen", "turn")
    adopted, refused = adopt([USER], held, [USER, A1, U2, A2, U3])
    assert refused is None and adopted == [USER, A1, U2, A2]


def test_an_interrupted_last_turn_is_not_answered_and_its_messages_are_held():
    # The call appended U2 and was cut mid-turn: the agent sends U2 again.
    held = _segments("prompt", "turn", "append", "gen", "stopped")
    adopted, refused = adopt([USER], held, [USER, A1, U2])
    assert refused is None and adopted == [USER, A1, U2]


def test_fewer_assistant_messages_than_answered_turns_are_refused():
    held = _segments("prompt", "turn", "append", "gen", "turn")
    _, refused = adopt([USER], held, [USER, A1, U2])
    assert refused is not None and refused.field == "messages[3]"
    assert "2 answered turns" in str(refused)


def test_other_opening_messages_are_refused_at_the_first_that_differs():
    _, refused = adopt([USER], _segments("prompt", "turn"), [U2, A1])
    assert refused is not None and refused.field == "messages[0]"
