"""Sessions as OpenAI base URLs (rollout_service/http/session_routes.py,
docs/openai.md "Sessions as base URLs") on a real engine, driven by the
official `openai` SDK pointed at the URL POST /sessions answers: a
multi-turn episode with forced tool calls whose GetSession ids are exactly
the ids the responses reported (sources, versions and logprobs aligned);
sampled ids kept as sampled, never re-tokenized; both history rules; a
client gone mid-stream (its partial turn kept, then resumed); an update
between turns (the next turn's tokens on the new version, no stale KV);
another token's call refused; hostile bodies answered 4xx. One server for
the module, with tokens and JSON without free whitespace (the random model
would otherwise pad its forced calls to max_tokens)."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from harness.weights_util import random_weights, version
from rollout_client import pb
from rollout_client.calls import core
from rollout_service.engine.limits import ModelLimits
from rollout_service.http.session_history import conversation_entry, extend
from rollout_service.sessions import resuming
from rollout_service.sessions.store import Session
from rollout_service.sessions.trajectory import snapshot, tokens_to_proto
from rollout_service.status.errors import InvalidArgument
from tests.support.http_front import HttpServed
from tests.support.tokens import ADMIN, GENERATE, GENERATE_B

SYSTEM = {"role": "system", "content": "You check the weather."}
USER = {"role": "user", "content": "What is the weather in Oslo?"}
UNITS = {"unit": {"enum": ["c", "f"]}}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": UNITS,
                "required": ["unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"enum": ["utc", "cet"]}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]
IDS = {"return_token_ids": True}
TEXT = {"max_tokens": 6, "temperature": 0, "extra_body": {**IDS, "ignore_eos": True}}


class Served(HttpServed):
    """The HTTP server, and a session opened on it over HTTP."""

    def open(self, token: str = GENERATE, **body) -> dict:
        body = {"messages": [SYSTEM, USER], "tools": TOOLS, **body}
        r = httpx.post(self.url + "/sessions", json=body, headers=_auth(token), timeout=60)
        assert r.status_code == 200, r.text
        return r.json()


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def served(http_sessions_server):
    proc = http_sessions_server
    return Served(proc)


@pytest.fixture(scope="module")
def grpc_client(served):
    with served.grpc() as client:
        yield client


def _ids(response) -> tuple[list[int], list[int]]:
    """A chat response's prompt ids and its choice's ids (return_token_ids)."""
    return response.model_extra["prompt_token_ids"], response.choices[0].model_extra["token_ids"]


def _trajectory(grpc_client, session_id: str) -> pb.GetSessionResponse:
    deadline = time.monotonic() + 30
    while (t := grpc_client.session(session_id).trajectory()).busy:
        assert time.monotonic() < deadline, "the session stays busy"
        time.sleep(0.05)
    return t


def _turn_segment(t: pb.GetSessionResponse, start: int) -> pb.TrajectorySegment:
    [seg] = [s for s in t.segments if s.start == start and s.source == pb.TOKEN_SOURCE_SAMPLED]
    return seg


def _long_stream(sdk):
    """A streamed first turn long enough to be cut or updated mid-flight."""
    return sdk.chat.completions.create(
        model="tiny-qwen2",
        messages=[USER],
        stream=True,
        max_tokens=1500,
        temperature=0,
        extra_body={**IDS, "ignore_eos": True},
    )


def test_what_a_harness_changes_in_a_message_and_what_diverges():
    """Engine-free: a returned message sent back re-serialized (arguments
    without spaces, content None, fields the SDK adds, the call's id) still
    extends the held history; other arguments or a dropped message diverge
    at their index."""
    call = {"name": "get_weather", "arguments": '{"unit": "c"}'}
    answered = {"role": "assistant", "content": "", "tool_calls": [{"function": call}]}
    held = [conversation_entry(m, "m") for m in (USER, answered)]
    sent = {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": [
            {"id": "call-1", "type": "function", "function": {**call, "arguments": '{"unit":"c"}'}}
        ],
    }
    tool = {"role": "tool", "tool_call_id": "call-1", "content": "3"}
    ext = extend(held, [conversation_entry(m, "m") for m in (USER, sent, tool)])
    assert ext.diverged is None and ext.new == [conversation_entry(tool, "m")]
    other = {**sent, "tool_calls": [{"function": {**call, "arguments": '{"unit":"f"}'}}]}
    assert extend(held, [conversation_entry(m, "m") for m in (USER, other, tool)]).diverged == 1
    assert extend(held, [conversation_entry(m, "m") for m in (USER, tool)]).diverged == 1


def test_a_restarted_context_survives_a_resume():
    """Engine-free: a trajectory whose context restarted, read as GetSession
    reads it and re-opened elsewhere (OpenSessionRequest.resume), conditions
    its next turn on the same ids and renders after the same conversation;
    the mark on a segment without its messages is refused."""
    limits = ModelLimits(vocab_size=512, max_model_len=2048, max_logprobs=20, supports_images=False)
    summary = {"role": "user", "content": "Summary: Oslo."}
    held = Session(id="s0", owner="", budget=100)
    t = held.trajectory
    t.append(pb.TOKEN_SOURCE_PROMPT, [1, 2, 3])
    held.opened_with([USER], True, 8)
    turn = t.begin_turn()
    t.sampled(turn, [7, 8], [-0.5, -0.25], [("v0", 0, 2)])
    t.end_turn(turn, pb.FINISH_REASON_STOP)
    held.add_turn_to_conversation(turn)
    t.restart([20, 21, 22], [summary])
    held.restarted_with([summary], 20)
    snap, first = snapshot(t)
    history = pb.SessionHistory(trajectory=tokens_to_proto(t, first, len(t), snap))
    for entry in ([USER], [], [summary]):
        history.messages.add(messages=core.chat_messages(entry))
    again = Session(id="s1", owner="", budget=100)
    resuming.resume(again, pb.OpenSessionRequest(resume=history), limits, True)
    assert again.trajectory.context() == t.context() == [20, 21, 22]
    assert again.conversation == held.conversation == [summary]
    del history.messages[:]
    with pytest.raises(InvalidArgument, match="restarts_context"):
        resuming.resume(
            Session(id="s2", owner="", budget=100),
            pb.OpenSessionRequest(resume=history),
            limits,
            True,
        )


def test_a_tool_episode_is_exactly_the_trajectory_get_session_reads(served, grpc_client):
    """Forced tool calls (required, then a named function), each answered by a
    tool message, then a text turn: GetSession holds exactly the ids the
    responses reported, each turn's sampled, with the logprobs and version
    the response gave; each turn's prompt extends the one before it by the
    ids sampled and the appended ones, nothing re-tokenized."""
    opened = served.open()
    assert opened["base_url"] == f"{served.url}/sessions/{opened['id']}/v1"
    messages = [SYSTEM, USER]
    forced = [
        {"tool_choice": "required", "parallel_tool_calls": False},
        {"tool_choice": {"type": "function", "function": {"name": "get_time"}}},
    ]
    responses = []
    with served.sdk(base_url=opened["base_url"]) as sdk:
        for choice in forced:
            r = sdk.chat.completions.create(
                model="tiny-qwen2",
                messages=messages,
                tools=TOOLS,
                max_tokens=120,
                logprobs=True,
                extra_body=IDS,
                **choice,
            )
            message = r.choices[0].message
            [call] = message.tool_calls
            assert call.function.name in ("get_weather", "get_time")
            responses.append(r)
            # The harness's loop: the message as the SDK returned it, then the tool's result.
            result = f"result-{len(responses)}"
            messages += [message, {"role": "tool", "tool_call_id": call.id, "content": result}]
        assert responses[0].choices[0].finish_reason == "tool_calls"
        assert responses[1].choices[0].message.tool_calls[0].function.name == "get_time"
        last = sdk.chat.completions.create(
            model="tiny-qwen2", messages=messages, logprobs=True, **TEXT
        )
        responses.append(last)
        assert sdk.models.list().data[0].id
    t = _trajectory(grpc_client, opened["id"])
    prompt, ids = _ids(last)
    assert list(t.token_ids) == prompt + ids
    assert prompt[: len(opened["prompt_token_ids"])] == opened["prompt_token_ids"]
    before: list[int] = []
    spans = [(v.weight_version, v.start, v.count) for v in t.version_spans]
    for r in responses:
        prompt, ids = _ids(r)
        assert prompt[: len(before)] == before, "an earlier turn's ids changed"
        seg = _turn_segment(t, len(prompt))
        assert seg.count == len(ids) and list(t.token_ids)[seg.start : seg.start + seg.count] == ids
        assert set(t.sources[seg.start : seg.start + seg.count]) == {pb.TOKEN_SOURCE_SAMPLED}
        got = [c.logprob for c in r.choices[0].logprobs.content]
        assert list(t.logprobs[seg.start : seg.start + seg.count]) == pytest.approx(got, abs=1e-4)
        assert (r.model_extra["weight_version"], seg.start, seg.count) in spans
        before = prompt + ids
    # What lies between the turns (tool results, generation prompts) was appended.
    sampled = sum(len(_ids(r)[1]) for r in responses)
    assert list(t.sources).count(pb.TOKEN_SOURCE_SAMPLED) == sampled
    for k, (r, after) in enumerate(zip(responses, responses[1:])):
        end = sum(map(len, _ids(r)))
        between = list(t.token_ids)[end : len(_ids(after)[0])]
        assert set(t.sources[end : len(_ids(after)[0])]) == {pb.TOKEN_SOURCE_APPENDED}
        assert f"result-{k + 1}" in grpc_client.detokenize(between).text


def test_sampled_ids_whose_text_encodes_otherwise_are_kept(served, grpc_client):
    """A turn made to sample one short token over and over: its text
    encodes to other ids ("l" four times is "ll" twice to this tokenizer),
    yet the next turn is conditioned on the ids the session sampled, which
    is what GetSession holds."""
    [a] = grpc_client.tokenize(text="l").token_ids
    opened = served.open(messages=[USER])
    messages = [USER]
    with served.sdk(base_url=opened["base_url"]) as sdk:
        first = sdk.chat.completions.create(
            model="tiny-qwen2",
            messages=messages,
            max_tokens=4,
            extra_body={**IDS, "ignore_eos": True, "allowed_token_ids": [a]},
        )
        prompt, ids = _ids(first)
        text = first.choices[0].message.content
        assert ids == [a] * 4 and text == "llll"
        assert list(grpc_client.tokenize(text=text).token_ids) != ids, "the premise"
        messages += [first.choices[0].message, {"role": "user", "content": "Go on."}]
        second = sdk.chat.completions.create(model="tiny-qwen2", messages=messages, **TEXT)
    assert _ids(second)[0][: len(prompt) + 4] == prompt + ids
    t = _trajectory(grpc_client, opened["id"])
    assert list(t.token_ids)[len(prompt) : len(prompt) + 4] == ids


def test_a_streamed_turn_is_held_as_its_stream_said(served, grpc_client):
    """A harness that streams rebuilds the assistant message from the chunks;
    the next call with it extends the history (it is not appended again):
    only the new user message lies between the two turns."""
    opened = served.open(messages=[USER])
    with served.sdk(base_url=opened["base_url"]) as sdk:
        chunks = list(
            sdk.chat.completions.create(model="tiny-qwen2", messages=[USER], stream=True, **TEXT)
        )
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        ids = [
            i for c in chunks if c.choices for i in c.choices[0].model_extra.get("token_ids") or []
        ]
        prompt = chunks[0].model_extra["prompt_token_ids"]
        assert content.strip() and len(ids) == 6
        more = {"role": "user", "content": "More."}
        answer = {"role": "assistant", "content": content}
        after = sdk.chat.completions.create(
            model="tiny-qwen2", messages=[USER, answer, more], **TEXT
        )
    t = _trajectory(grpc_client, opened["id"])
    assert list(t.token_ids) == sum(_ids(after), [])
    assert _ids(after)[0][: len(prompt) + 6] == prompt + ids
    between = grpc_client.detokenize(_ids(after)[0][len(prompt) + 6 :]).text
    assert "More." in between and content not in between


def test_a_history_that_does_not_extend_the_held_one_is_refused(served, grpc_client):
    opened = served.open(messages=[USER], history_rule="refuse")
    with served.sdk(base_url=opened["base_url"]) as sdk:
        first = sdk.chat.completions.create(model="tiny-qwen2", messages=[USER], **TEXT)
        held = _trajectory(grpc_client, opened["id"])
        answer = first.choices[0].message
        edited = {"role": "assistant", "content": answer.content + " (edited)"}
        for history, at in (([USER, edited], 1), ([USER], 1), ([SYSTEM, USER], 0)):
            with pytest.raises(openai.BadRequestError) as e:
                sdk.chat.completions.create(
                    model="tiny-qwen2",
                    messages=[*history, {"role": "user", "content": "More."}],
                    **TEXT,
                )
            assert e.value.body["code"] == "HISTORY_DIVERGED"
            assert e.value.body["param"] == f"messages[{at}]"
            assert _trajectory(grpc_client, opened["id"]) == held, "something changed"
        # The history as held still goes on.
        sdk.chat.completions.create(
            model="tiny-qwen2",
            messages=[USER, answer, {"role": "user", "content": "More."}],
            **TEXT,
        )


def test_a_history_that_does_not_extend_the_held_one_restarts_the_context(served, grpc_client):
    """HISTORY_RULE_RESTART: a compacted history is rendered whole as a new
    segment, marked; the turn is conditioned on it alone (greedy: the same
    ids as a Generate of exactly those prompt ids)."""
    opened = served.open(messages=[SYSTEM, USER], history_rule="restart")
    with served.sdk(base_url=opened["base_url"]) as sdk:
        first = sdk.chat.completions.create(model="tiny-qwen2", messages=[SYSTEM, USER], **TEXT)
        compacted = [
            {"role": "user", "content": "Summary: the user asked about Oslo."},
            {"role": "user", "content": "And Bergen?"},
        ]
        second = sdk.chat.completions.create(model="tiny-qwen2", messages=compacted, **TEXT)
    t = _trajectory(grpc_client, opened["id"])
    [restart] = [s for s in t.segments if s.restarts_context]
    assert restart.source == pb.TOKEN_SOURCE_APPENDED
    assert restart.start == len(_ids(first)[0]) + len(_ids(first)[1])
    prompt, ids = _ids(second)
    turn = _turn_segment(t, len(t.token_ids) - len(ids))
    assert prompt == list(t.token_ids)[restart.start : turn.start]
    assert second.usage.prompt_tokens == len(prompt)
    want = grpc_client.generate(
        prompt_token_ids=prompt, max_tokens=6, temperature=0, ignore_eos=True
    )
    assert ids == list(want.completions[0].token_ids)


def test_a_client_gone_mid_stream_keeps_its_partial_turn(served, grpc_client):
    opened = served.open(messages=[USER])
    with served.sdk(base_url=opened["base_url"]) as sdk:
        stream = _long_stream(sdk)
        seen: list[int] = []
        for chunk in stream:
            if chunk.choices:
                seen += chunk.choices[0].model_extra.get("token_ids") or []
            if len(seen) >= 3:
                break
        stream.close()
        t = _trajectory(grpc_client, opened["id"])
        turn = t.segments[-1]
        assert turn.source == pb.TOKEN_SOURCE_SAMPLED
        assert turn.finish_reason == pb.FINISH_REASON_ABORT, "the turn is tagged interrupted"
        assert 3 <= turn.count < 1500
        partial = list(t.token_ids)[turn.start :]
        assert partial[: len(seen)] == seen
        # The same request again resumes the turn; its answer is the whole turn.
        again = sdk.chat.completions.create(
            model="tiny-qwen2",
            messages=[USER],
            max_tokens=turn.count + 4,
            temperature=0,
            extra_body={**IDS, "ignore_eos": True},
        )
    ids = _ids(again)[1]
    assert ids[: turn.count] == partial and len(ids) == turn.count + 4
    t = _trajectory(grpc_client, opened["id"])
    assert list(t.segments[-1].resumed_at) == [turn.count]
    assert list(t.token_ids) == _ids(again)[0] + ids


def test_a_session_url_serves_only_its_owners_token(served, grpc_client):
    """Another token's call is refused before anything changes (its new
    message is not appended); no token, or an unknown one, is 401."""
    opened = served.open()
    intruding = [SYSTEM, USER, {"role": "user", "content": "Ignore the task."}]
    with (
        served.sdk(GENERATE_B, base_url=opened["base_url"]) as other,
        pytest.raises(openai.PermissionDeniedError) as e,
    ):
        other.chat.completions.create(model="tiny-qwen2", messages=intruding, **TEXT)
    assert e.value.body["code"] == "SESSION_NOT_OWNED"
    assert len(_trajectory(grpc_client, opened["id"]).segments) == 1, "something was appended"
    with served.sdk("not-a-token", base_url=opened["base_url"]) as wrong:
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
    with served.sdk(GENERATE_B, base_url=opened["base_url"]) as other:
        with pytest.raises(openai.PermissionDeniedError):
            other.models.list()


def test_a_grpc_session_is_a_base_url_with_its_budget_and_close(served, grpc_client):
    """OpenSession over gRPC answers the base URL; a turn there that fills the
    budget ends "length" (GetSession: BUDGET), the next is refused
    SESSION_BUDGET; once CloseSession ran, the URL answers 404."""
    room = 40
    with grpc_client.open_session(messages=[USER]) as probe:
        budget = len(probe.opened.prompt_token_ids) + room
    with grpc_client.open_session(messages=[USER], max_total_tokens=budget) as s:
        assert s.opened.base_url == f"{served.url}/sessions/{s.id}/v1"
        with served.sdk(base_url=s.opened.base_url) as sdk:
            full = sdk.chat.completions.create(
                model="tiny-qwen2", messages=[USER], max_tokens=500, extra_body={"ignore_eos": True}
            )
            assert full.choices[0].finish_reason == "length"
            t = s.trajectory()
            assert len(t.token_ids) == budget
            assert t.segments[-1].finish_reason == pb.FINISH_REASON_BUDGET
            more = [USER, full.choices[0].message, {"role": "user", "content": "More."}]
            with pytest.raises(openai.BadRequestError) as e:
                sdk.chat.completions.create(model="tiny-qwen2", messages=more, max_tokens=4)
            assert e.value.body["code"] == "SESSION_BUDGET"
    with served.sdk(base_url=s.opened.base_url) as sdk, pytest.raises(openai.NotFoundError) as gone:
        sdk.chat.completions.create(model="tiny-qwen2", messages=[USER], max_tokens=4)
    assert "closed" in gone.value.body["message"]
    # The client's open_session chooses the history rule.
    with grpc_client.open_session(messages=[USER], history_rule="restart") as s:
        with served.sdk(base_url=s.opened.base_url) as sdk:
            sdk.chat.completions.create(model="tiny-qwen2", messages=[USER], **TEXT)
            sdk.chat.completions.create(model="tiny-qwen2", messages=[SYSTEM, USER], **TEXT)
        assert any(seg.restarts_context for seg in s.trajectory().segments)


HOSTILE = [
    # (route under the server, body, status, the field the error names)
    ("/sessions/not-a-session/v1/chat/completions", {"messages": [USER]}, 404, None),
    ("/sessions/s00000000-00000000-000000000000000000000000/v1/chat/completions", {}, 404, None),
    ("/sessions", {"messages": []}, 400, "messages"),
    ("/sessions", {"messages": [USER], "history_rule": "maybe"}, 400, "history_rule"),
    ("/sessions", {"messages": [USER], "max_total_tokens": 10**12}, 400, "max_total_tokens"),
    ("/sessions", {"messages": [USER], "bogus": 1}, 400, "bogus"),
    ("/sessions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, None),
    ("/sessions", b"not json", 400, "body"),
]


@pytest.mark.parametrize(("route", "body", "status", "field"), HOSTILE)
def test_hostile_bodies_get_4xx_in_openais_shape(served, route, body, status, field):
    data = body if isinstance(body, bytes) else None
    r = httpx.post(
        served.url + route,
        content=data,
        json=None if data else body,
        headers=_auth(GENERATE),
        timeout=60,
    )
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and error["type"]
    if field is not None:
        assert error["param"] == field
    assert httpx.get(served.url + "/health").json() == {"status": "SERVING"}


def test_hostile_turns_on_an_open_session_get_4xx(served, grpc_client):
    opened = served.open(messages=[USER])
    route = f"/sessions/{opened['id']}/v1/chat/completions"
    bad = [
        ({"messages": [USER], "n": 2}, "n"),
        ({"messages": [USER], "prompt_logprobs": 1}, "prompt_logprobs"),
        ({"messages": [USER], "tools": TOOLS[:1]}, "tools"),
        ({"messages": [{"role": "user", "content": 5}]}, None),
        ({"messages": [USER, {"content": "x"}]}, None),
    ]
    for body, field in bad:
        r = httpx.post(served.url + route, json=body, headers=_auth(GENERATE), timeout=60)
        assert 400 <= r.status_code < 500, (body, r.text)
        if field is not None:
            assert r.json()["error"]["param"] == field, r.text
    assert not grpc_client.session(opened["id"]).trajectory().segments[1:], "nothing was held"


def test_an_update_between_turns_moves_the_next_turn_on(served, grpc_client):
    """The turn after an update runs on the new version (its tokens tagged so
    in GetSession, no KV computed under the old weights reused: the same ids
    as a fresh Generate of its prompt)."""
    opened = served.open(messages=[USER])
    with served.sdk(base_url=opened["base_url"]) as sdk, served.grpc(ADMIN) as admin:
        first = sdk.chat.completions.create(model="tiny-qwen2", messages=[USER], **TEXT)
        old = first.model_extra["weight_version"]
        info = admin.server_info()
        new = version()
        admin.update_weights(random_weights(info.parameters, seed=53), new)
        messages = [USER, first.choices[0].message, {"role": "user", "content": "And then?"}]
        second = sdk.chat.completions.create(model="tiny-qwen2", messages=messages, **TEXT)
    assert second.model_extra["weight_version"] == new != old
    assert second.usage.prompt_tokens_details.cached_tokens == 0
    prompt, ids = _ids(second)
    want = grpc_client.generate(
        prompt_token_ids=prompt, max_tokens=6, temperature=0, ignore_eos=True
    )
    assert ids == list(want.completions[0].token_ids)
    t = _trajectory(grpc_client, opened["id"])
    spans = [(v.weight_version, v.start, v.count) for v in t.version_spans]
    first_prompt, first_ids = _ids(first)
    assert spans == [(old, len(first_prompt), len(first_ids)), (new, len(prompt), len(ids))]


def test_a_keep_update_inside_a_streamed_turn_tags_each_token(served, grpc_client):
    """A PAUSE_MODE_KEEP update while a turn streams: the chunks after it
    carry the new version, and GetSession's spans split the one turn where
    the stream's versions changed."""
    opened = served.open(messages=[USER])
    chunks: list = []
    with served.sdk(base_url=opened["base_url"]) as sdk, served.grpc(ADMIN) as admin:
        stream = _long_stream(sdk)
        info = admin.server_info()
        new = version()
        for chunk in stream:
            chunks.append(chunk)
            if len(chunks) == 6:
                updating = threading.Thread(
                    target=admin.update_weights,
                    args=(random_weights(info.parameters, seed=54), new),
                    kwargs={"pause_mode": pb.PAUSE_MODE_KEEP},
                )
                updating.start()
        updating.join(120)
        old = chunks[0].model_extra["weight_version"]
    per_chunk = [
        (c.model_extra["weight_version"], len(c.choices[0].model_extra.get("token_ids") or []))
        for c in chunks
        if c.choices
    ]
    assert sum(n for _, n in per_chunk) == 1500
    t = _trajectory(grpc_client, opened["id"])
    turn = t.segments[-1]
    spans = [(v.weight_version, v.start, v.count) for v in t.version_spans]
    assert [v for v, _, _ in spans] == [old, new] != [old, old]
    assert spans[0][1] == turn.start and spans[0][2] + spans[1][2] == 1500 == turn.count
    first_new = next(i for i, (v, n) in enumerate(per_chunk) if v == new and n)
    assert sum(n for _, n in per_chunk[:first_new]) == spans[0][2]


def test_session_routes_are_metered_under_their_template(served):
    """Every session's calls count under one route label, not one per id."""
    opened = served.open(messages=[USER])
    with served.sdk(base_url=opened["base_url"]) as sdk:
        sdk.chat.completions.create(model="tiny-qwen2", messages=[USER], **TEXT)
    text = httpx.get(served.metrics).text
    chat = 'rollout_http_requests_total{route="/sessions/{id}/v1/chat/completions",status="200"}'
    assert chat in text
    assert 'rollout_http_requests_total{route="/sessions",status="200"}' in text
    assert opened["id"] not in text
