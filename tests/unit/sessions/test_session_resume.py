"""OpenSession's `resume` without an engine: a history read with GetSession
re-opens as the same trajectory and render state, read back in parts
(from_segment) it joins into the whole, and every malformed history is
refused naming its field before anything is held."""

from __future__ import annotations

import math

import pytest

from rollout_client import pb
from rollout_client.calls import core
from rollout_service.engine.limits import ModelLimits
from rollout_service.sessions import resuming
from rollout_service.sessions.store import Session
from rollout_service.sessions.trajectory import snapshot, tokens_to_proto
from rollout_service.status.errors import FailedPrecondition, InvalidArgument

LIMITS = ModelLimits(vocab_size=512, max_model_len=2048, max_logprobs=20, supports_images=False)
USER = {"role": "user", "content": "2+2?"}
TOOL = {"role": "tool", "content": "4"}


def _held() -> Session:
    """A session as the live calls leave it: a chat prompt, a turn that was
    interrupted and resumed across an update, the generation prompt, a turn
    that stopped on a token, a tool message, appended ids."""
    s = Session(id="s0", owner="", budget=100, pinned_version="")
    t = s.trajectory
    t.append(pb.TOKEN_SOURCE_PROMPT, [1, 2, 3])
    s.opened_with([USER], True, 8)
    turn = t.begin_turn(cached_prompt_tokens=0)
    t.sampled(turn, [7, 8], [-0.5, -0.25], [("v0", 0, 2)])
    t.end_turn(turn, pb.FINISH_REASON_ABORT)
    t.begin_turn()
    t.sampled(turn, [9], [-1.0], [("v1", 0, 1)])
    t.end_turn(turn, pb.FINISH_REASON_LENGTH)
    s.add_turn_to_conversation(turn)
    t.append(pb.TOKEN_SOURCE_APPENDED, [5, 6]).generation_prompt = True
    turn = t.begin_turn(cached_prompt_tokens=5)
    t.sampled(turn, [10, 11], [-0.1, -0.2], [("v1", 0, 2)])
    t.end_turn(turn, pb.FINISH_REASON_STOP, "11", on_token=True)
    s.add_turn_to_conversation(turn)
    t.append(pb.TOKEN_SOURCE_APPENDED, [12])
    s.appended_messages([TOOL], 5)
    return s


def _read(s: Session, from_segment: int = 0) -> pb.GetSessionResponse:
    snap, first = snapshot(s.trajectory, from_segment)
    return tokens_to_proto(s.trajectory, first, len(s.trajectory), snap)


def _request(s: Session, messages=None, **kw) -> pb.OpenSessionRequest:
    history = pb.SessionHistory(trajectory=_read(s))
    history.trajectory.pinned_weight_version = s.pinned_version  # as GetSession sets it
    for entry in messages or []:
        history.messages.add(messages=core.chat_messages(entry))
    return pb.OpenSessionRequest(resume=history, **kw)


def _resume(request: pb.OpenSessionRequest, budget: int = 100, whole: bool = True) -> Session:
    s = Session(id="s1", owner="", budget=budget)
    resuming.resume(s, request, LIMITS, whole)
    return s


MESSAGES = [[USER], [], [], [], [TOOL]]


def test_a_resumed_history_is_the_trajectory_and_render_state_it_was_read_from():
    held = _held()
    again = _resume(_request(held, MESSAGES))
    assert _read(again) == _read(held)
    assert again.resumed_tokens == len(held.trajectory)
    # what the next append renders after: the same messages and turns
    assert again.chat and held.chat
    assert again.conversation == held.conversation
    assert again.text_bytes == held.text_bytes
    assert again.trajectory.segments[3].stop_token == 11
    # without the messages, later appends render isolated, as for ids
    bare = _resume(_request(held))
    assert bare.conversation is None and not bare.chat


def test_reading_from_a_segment_gives_the_tail_that_joins_into_the_whole():
    held = _held()
    whole = _read(held)
    for k in range(len(whole.segments) + 1):
        tail = _read(held, k)
        first = whole.segments[k].start if k < len(whole.segments) else len(whole.token_ids)
        assert list(tail.token_ids) == list(whole.token_ids[first:])
        assert list(tail.segments) == list(whole.segments[k:])
        assert all(s.start + s.count > first for s in tail.version_spans)
        # the first span may start before the tail; none that ends before it
        assert list(tail.version_spans) == [
            s for s in whole.version_spans if s.start + s.count > first
        ]


def _broken(edit, messages=None) -> pb.OpenSessionRequest:
    request = _request(_held(), messages)
    edit(request.resume)
    return request


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda h: h.trajectory.ClearField("token_ids"), "resume.trajectory.token_ids"),
        (lambda h: h.trajectory.sources.pop(), "resume.trajectory.sources"),
        (lambda h: h.trajectory.logprobs.append(0), "resume.trajectory.logprobs"),
        (lambda h: h.trajectory.ClearField("segments"), "resume.trajectory.segments"),
        (lambda h: h.trajectory.segments[0].__setattr__("source", 2), "segments[0].source"),
        (lambda h: h.trajectory.segments[2].__setattr__("start", 7), "segments[2].start"),
        (lambda h: h.trajectory.segments[4].__setattr__("count", 9), "segments[4].count"),
        (lambda h: (h.trajectory.segments.pop(), h.messages.pop()), "resume.trajectory.segments"),
        (lambda h: h.trajectory.sources.__setitem__(4, 3), "resume.trajectory.sources[4]"),
        (lambda h: h.trajectory.logprobs.__setitem__(0, -1.0), "logprobs[0]"),
        (lambda h: h.trajectory.logprobs.__setitem__(3, math.nan), "logprobs[3]"),
        (lambda h: h.trajectory.token_ids.__setitem__(5, 512), "resume.trajectory.token_ids[5]"),
        (lambda h: h.trajectory.version_spans.pop(), "resume.trajectory.version_spans"),
        (lambda h: h.trajectory.version_spans[0].__setattr__("start", 0), "version_spans[0]"),
        (
            lambda h: h.trajectory.version_spans.add(weight_version="x", start=1, count=1),
            "version_spans[",
        ),
        (lambda h: h.trajectory.segments[3].__setattr__("stop_token_id", 10), "stop_token_id"),
        (lambda h: h.trajectory.segments[1].resumed_at.append(1), "resumed_at[1]"),
        (lambda h: h.trajectory.segments[4].__setattr__("stop_reason", "x"), "segments[4]."),
        (lambda h: h.trajectory.segments[1].__setattr__("finish_reason", 99), "finish_reason"),
        (lambda h: h.trajectory.segments[4].__setattr__("generation_prompt", True), "generation"),
        (lambda h: h.messages.pop(), "resume.messages"),
        (lambda h: h.messages[1].messages.extend(core.chat_messages([USER])), "resume.messages[1]"),
        (lambda h: h.messages[4].messages[0].__setattr__("role", ""), "resume.messages[4]"),
        (
            lambda h: h.trajectory.__setattr__("pinned_weight_version", "v" * 2000),
            "pinned_weight_version",
        ),
    ],
)
def test_a_malformed_history_is_refused_naming_its_field(edit, field):
    with pytest.raises(InvalidArgument) as e:
        _resume(_broken(edit, MESSAGES))
    assert field in e.value.field


def test_a_history_past_the_budget_is_refused_with_the_numbers():
    with pytest.raises(FailedPrecondition, match="11 tokens do not fit .* budget .* of 10"):
        _resume(_request(_held(), MESSAGES), budget=10)
    assert len(_resume(_request(_held(), MESSAGES), budget=11).trajectory) == 11  # may fill it


def test_the_pin_comes_from_the_history():
    held = _held()
    held.pinned_version = "v0"
    assert _resume(_request(held)).pinned_version == "v0"
    with pytest.raises(InvalidArgument) as e:
        _resume(_request(held, pin_weight_version=True))
    assert e.value.field == "pin_weight_version"


def test_tools_need_a_chat_prompt():
    request = _request(_held(), tools_json=['{"type": "function"}'])
    with pytest.raises(InvalidArgument) as e:
        _resume(request)
    assert e.value.field == "tools_json"
    assert _resume(_request(_held(), MESSAGES, tools_json=['{"a": 1}'])).tools == [{"a": 1}]
