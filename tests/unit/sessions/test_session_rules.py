"""Sessions' pure pieces, without an engine: the template rule, the
trajectory's bookkeeping, the store's bounds, owners and expiry, and what
an id says of the server that issued it."""

from __future__ import annotations

from dataclasses import dataclass

import jinja2
import pytest

from rollout_client import pb
from rollout_service.ops.auth import Caller
from rollout_service.sessions import rendering
from rollout_service.sessions.session_ids import SessionIds
from rollout_service.sessions.store import SessionLimits, SessionStore
from rollout_service.sessions.trajectory import Trajectory, snapshot, tokens_to_proto
from rollout_service.status.errors import (
    Aborted,
    FailedPrecondition,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)

PLAIN = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Drops the reasoning of every assistant message but the last (as Qwen3's does).
THINK_STRIPPING = PLAIN.replace(
    "{{ m['content'] }}",
    "{% if m['role'] == 'assistant' and not loop.last %}{{ m['content'].split('</think>')[-1] }}"
    "{% else %}{{ m['content'] }}{% endif %}",
)


def renderer(template: str):
    t = jinja2.Environment().from_string(template)
    return lambda conv, gen: t.render(messages=conv, add_generation_prompt=gen)


def test_the_bridge_is_what_the_template_renders_after_the_held_turn():
    history = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4 "}]
    new = [{"role": "tool", "content": "ok"}]
    text = rendering.bridge(renderer(PLAIN), history, True, new, False)
    # the end of the sampled message, then the tool message; the trailing
    # space the model sampled is not rendered twice
    assert text == "</s>\n<|tool|>\nok</s>\n"
    gen = rendering.bridge(renderer(PLAIN), [*history, *new], False, [], True)
    assert gen == "<|assistant|>\n"


def test_a_template_that_drops_earlier_reasoning_is_caught():
    history = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>a</think>b"},
    ]
    new = [{"role": "user", "content": "next"}]
    with pytest.raises(FailedPrecondition) as e:
        rendering.bridge(renderer(THINK_STRIPPING), history, True, new, False)
    assert e.value.reason == pb.ERROR_REASON_TEMPLATE_NOT_APPEND_ONLY
    assert "<think>" in e.value.message
    # the isolated stand-in has no reasoning to drop: the same template works
    stand_in = rendering.stand_in(True)
    assert rendering.bridge(renderer(THINK_STRIPPING), stand_in, True, new, False) == (
        "</s>\n<|user|>\nnext</s>\n"
    )


def test_a_stop_token_the_model_sampled_is_not_repeated():
    assert rendering.drop_sampled_stop([0, 5, 6], 0) == [5, 6]
    assert rendering.drop_sampled_stop([0, 5, 6], None) == [0, 5, 6]
    assert rendering.drop_sampled_stop([5, 6], 0) == [5, 6]


def test_the_trajectory_keeps_sources_logprobs_and_versions_per_token():
    t = Trajectory()
    t.append(pb.TOKEN_SOURCE_PROMPT, [1, 2, 3])
    turn = t.begin_turn()
    t.sampled(turn, [7, 8], [-0.5, -0.25], [("v0", 0, 2)])
    t.end_turn(turn, pb.FINISH_REASON_ABORT)
    # an interrupted turn resumes as the same segment; the version moved on
    again = t.begin_turn()
    assert again is turn and turn.resumed_at == [2]
    t.sampled(turn, [9], [-1.0], [("v1", 0, 1)])
    t.end_turn(turn, pb.FINISH_REASON_LENGTH)
    t.append(pb.TOKEN_SOURCE_APPENDED, [4])
    snap, first = snapshot(t)
    out = tokens_to_proto(t, first, len(t), snap)
    assert list(out.token_ids) == [1, 2, 3, 7, 8, 9, 4]
    assert list(out.sources) == [1, 1, 1, 2, 2, 2, 3]
    assert list(out.logprobs) == [0, 0, 0, -0.5, -0.25, -1.0, 0]
    assert [(s.weight_version, s.start, s.count) for s in out.version_spans] == [
        ("v0", 3, 2),
        ("v1", 5, 1),
    ]
    assert [(s.source, s.start, s.count) for s in out.segments] == [(1, 0, 3), (2, 3, 3), (3, 6, 1)]
    assert out.segments[1].finish_reason == pb.FINISH_REASON_LENGTH
    assert list(out.segments[1].resumed_at) == [2]


def _store(clock, **kw):
    limits = dict(
        max_sessions=3,
        max_sessions_per_caller=2,
        max_session_tokens=1000,
        idle_timeout_seconds=10.0,
        max_model_len=512,
    )
    return SessionStore(SessionLimits(**{**limits, **kw}), clock=lambda: clock[0])


IDS = SessionIds("0a0a0a0a", "1b1b1b1b", "a test server")


def _open(store, owner, budget=100):
    s = store.new(IDS.issue(), owner, budget)
    store.add(s)
    return s


def test_the_store_bounds_sessions_per_caller_in_all_and_in_tokens():
    clock = [0.0]
    store = _store(clock)
    a1, _ = _open(store, "a"), _open(store, "a")
    with pytest.raises(ResourceExhausted, match="--max-sessions-per-caller"):
        store.new(IDS.issue(), "a", 100)
    _open(store, "b")
    with pytest.raises(ResourceExhausted, match=r"\(--max-sessions\)"):
        store.new(IDS.issue(), "c", 100)
    store.close(a1)
    with pytest.raises(ResourceExhausted, match="--max-session-tokens"):
        store.new(IDS.issue(), "c", 801)
    assert store.reserved == 200


def test_a_session_is_its_owners_and_admins():
    store = _store([0.0])
    s = _open(store, "a")
    assert store.get(s.id, Caller("a", admin=False)) is s
    assert store.get(s.id, Caller("x", admin=True)) is s
    with pytest.raises(PermissionDenied):
        store.get(s.id, Caller("b", admin=False))


def test_closed_and_expired_ids_say_which():
    clock = [0.0]
    store = _store(clock)
    me = Caller("a", admin=False)
    closed, idle, busy = _open(store, "a"), _open(store, "a"), _open(store, "b")
    store.close(closed)
    with pytest.raises(NotFound, match="was closed"):
        store.get(closed.id, me)
    busy.busy = True  # a session with a call running is not idle
    clock[0] = 11.0
    with pytest.raises(NotFound, match="expired after 10 s") as e:
        store.get(idle.id, me)
    assert e.value.reason == pb.ERROR_REASON_SESSION_NOT_FOUND
    assert store.get(busy.id, Caller("b", admin=False)) is busy


@dataclass(frozen=True)
class At:
    """Where a server listens (session_ids.Listening)."""

    host: str
    port: int


def test_an_id_says_which_server_and_run_issued_it():
    """Every id not of this run is NOT_FOUND: SESSION_LOST only for this
    server's own before a restart (its host name and address, a new run)."""
    ids = SessionIds.listening(At("0.0.0.0", 50051), "rollout-0")
    own = ids.issue()
    ids.check(own)
    restarted = SessionIds.listening(At("0.0.0.0", 50051), "rollout-0")
    assert restarted.server == ids.server and restarted.run != ids.run
    with pytest.raises(NotFound, match="before it restarted") as e:
        restarted.check(own)
    assert e.value.reason == pb.ERROR_REASON_SESSION_LOST
    # another host on the same port, another port on this host
    for other in (
        SessionIds.listening(At("0.0.0.0", 50051), "rollout-1"),
        SessionIds.listening(At("0.0.0.0", 50052), "rollout-0"),
    ):
        with pytest.raises(NotFound, match="opened on another server") as e:
            other.check(own)
        assert f"(server {ids.server};" in e.value.message
        assert e.value.reason == pb.ERROR_REASON_SESSION_NOT_FOUND
        assert other.name in e.value.message
    # --port 0 listens elsewhere at every start: each run is another server
    first = SessionIds.listening(At("127.0.0.1", 0), "h")
    again = SessionIds.listening(At("127.0.0.1", 0), "h")
    with pytest.raises(NotFound, match="another server"):
        again.check(first.issue())
    for bad in ("no-such-session", "", "../../etc/passwd", "s" + "0" * 40, own + "0"):
        with pytest.raises(NotFound, match="not a session id this server issues") as e:
            ids.check(bad)
        assert e.value.reason == pb.ERROR_REASON_SESSION_NOT_FOUND
        assert "s<8 hex digits>-<8 hex digits>-<24 hex digits>" in e.value.message


def test_one_call_at_a_time_on_a_session():
    store = _store([0.0])
    s = _open(store, "a")
    with store.using(s), pytest.raises(Aborted) as e, store.using(s):
        pass
    assert e.value.reason == pb.ERROR_REASON_SESSION_BUSY
    with store.using(s):  # free again
        pass
