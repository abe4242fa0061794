"""Sessions against a real engine: token in, token out; the template rule;
budgets; weight updates in the middle of a trajectory; interrupted turns;
and the hardening of every session RPC (owners, bounds, hostile input)."""

from __future__ import annotations

import itertools
import threading
import time

import grpc
import pytest
from transformers import AutoTokenizer

from harness.weights_util import random_weights, version
from rollout_client import RolloutClient, RolloutError, pb
from rollout_client.sessions import Session, loss_mask
from rollout_service.engine.tiny_models import ensure_model
from tests.support import sessions as setup
from tests.support.tokens import ADMIN, GENERATE, GENERATE_B

GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def admin(sessions_server):
    with RolloutClient(sessions_server.target, token=ADMIN, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def gen(sessions_server):
    with RolloutClient(sessions_server.target, token=GENERATE, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def gen_b(sessions_server):
    with RolloutClient(sessions_server.target, token=GENERATE_B, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def hf_tokenizer():
    return AutoTokenizer.from_pretrained(ensure_model("tiny-qwen2"))


def refused(call, code: grpc.StatusCode, reason: str) -> str:
    with pytest.raises(RolloutError) as e:
        call()
    assert (e.value.code, e.value.reason) == (code, reason), e.value.details
    return e.value.details


def _split_token(tok) -> tuple[int, int, int]:
    """A vocabulary token w whose text is also two tokens a + b: sampled as
    a then b, the text re-encodes as w (the drift class of rLLM #272)."""
    vocab = tok.get_vocab()
    for piece, w in sorted(vocab.items(), key=lambda kv: kv[1]):
        if len(piece) < 3 or piece.startswith("<"):
            continue
        for cut in range(1, len(piece)):
            a, b = vocab.get(piece[:cut]), vocab.get(piece[cut:])
            if a is not None and b is not None:
                text = tok.decode([a, b])
                if tok.encode(text, add_special_tokens=False) == [w]:
                    return a, b, w
    raise AssertionError("no token splits in two")


def test_the_next_turn_is_conditioned_on_the_sampled_ids_not_their_retokenization(
    gen, hf_tokenizer
):
    a, b, w = _split_token(hf_tokenizer)
    with gen.open_session(prompt_text="The store opens at nine") as s:
        assert s.generate(max_tokens=1, allowed_token_ids=[a], **GREEDY).completion.token_ids == [a]
        assert s.generate(max_tokens=1, allowed_token_ids=[b], **GREEDY).completion.token_ids == [b]
        held = list(s.trajectory().token_ids)
        assert held[-2:] == [a, b]
        # the text of what was sampled re-encodes to other ids
        retokenized = gen.tokenize(text=gen.detokenize(held).text).token_ids
        assert list(retokenized) != held and list(retokenized)[-1] == w
        turn = s.generate(max_tokens=8, **GREEDY)
        assert turn.usage.prompt_tokens == len(held)
        same = gen.generate(prompt_token_ids=held, max_tokens=8, **GREEDY)
        assert list(turn.completion.token_ids) == list(same.completions[0].token_ids)
        assert list(turn.completion.logprobs) == pytest.approx(
            list(same.completions[0].logprobs), abs=1e-3
        )
        t = s.trajectory()
        assert list(t.token_ids) == held + list(turn.completion.token_ids)
        assert loss_mask(t)[len(held) - 2 :] == [1] * (2 + len(turn.completion.token_ids))


def test_chat_appends_add_only_their_own_tokens(gen):
    messages = [{"role": "user", "content": "What is two plus two?"}]
    with gen.open_session(messages=messages) as s:
        prompt = list(s.opened.prompt_token_ids)
        assert prompt == list(gen.tokenize(messages=messages).token_ids)[: len(prompt)]
        first = s.generate(max_tokens=6, **GREEDY)
        sampled = list(first.completion.token_ids)
        appended = s.append(messages=[{"role": "tool", "content": "4"}])
        t = s.trajectory()
        gen_prompt = list(first.state.generation_prompt_token_ids)
        assert list(t.token_ids) == prompt + gen_prompt + sampled + list(appended.token_ids)
        text = gen.detokenize(list(appended.token_ids)).text
        assert text == "<|endoftext|>\n<|tool|>\n4<|endoftext|>\n"
        # the held ids, decoded, are the whole conversation as the template renders it
        whole = [*messages, {"role": "assistant", "content": first.completion.text}]
        whole.append({"role": "tool", "content": "4"})
        rendered = gen.tokenize(messages=whole).text.removesuffix("<|assistant|>\n")
        assert gen.detokenize(list(t.token_ids)).text == rendered
        assert [seg.source for seg in t.segments] == [
            pb.TOKEN_SOURCE_PROMPT,
            pb.TOKEN_SOURCE_APPENDED,
            pb.TOKEN_SOURCE_SAMPLED,
            pb.TOKEN_SOURCE_APPENDED,
        ]


def test_an_end_of_turn_token_the_model_sampled_is_not_repeated(gen):
    eos = list(gen.server_info().tokenizer.eos_token_ids)[0]
    messages = [{"role": "user", "content": "Say nothing."}]
    with gen.open_session(messages=messages) as s:
        turn = s.generate(max_tokens=4, allowed_token_ids=[eos], **GREEDY)
        assert list(turn.completion.token_ids) == [eos]
        assert turn.completion.finish_reason == pb.FINISH_REASON_STOP
        appended = list(s.append(messages=[{"role": "tool", "content": "4"}]).token_ids)
        assert gen.detokenize(appended).text == "\n<|tool|>\n4<|endoftext|>\n"
        whole = [*messages, {"role": "assistant", "content": ""}, {"role": "tool", "content": "4"}]
        rendered = gen.tokenize(messages=whole).text.removesuffix("<|assistant|>\n")
        assert gen.detokenize(list(s.trajectory().token_ids)).text == rendered


_THINK = pb.StructuredOutput(choice=pb.StructuredOutput.Choices(choices=["<think>no</think>yes"]))


@pytest.mark.parametrize("isolated", [False, True])
def test_a_template_that_drops_earlier_reasoning_is_refused_unless_isolated(gen, isolated):
    messages = [{"role": "user", "content": "Think, then answer."}]
    with gen.open_session(messages=messages, isolated_render=isolated) as s:
        turn = s.generate(max_tokens=32, structured_output=_THINK, **GREEDY)
        assert turn.completion.text.startswith("<think>no</think>yes")
        before = s.trajectory()
        new = [{"role": "user", "content": "And now?"}]
        if not isolated:
            why = refused(
                lambda: s.append(messages=new),
                grpc.StatusCode.FAILED_PRECONDITION,
                "TEMPLATE_NOT_APPEND_ONLY",
            )
            assert "<think>" in why
            assert s.trajectory() == before  # nothing changed
        else:
            ids = list(s.append(messages=new).token_ids)
            assert gen.detokenize(ids).text.endswith("<|user|>\nAnd now?<|endoftext|>\n")
            assert list(s.trajectory().token_ids) == list(before.token_ids) + ids


def test_the_budget_covers_the_whole_trajectory(gen, info_of):
    with gen.open_session(prompt_token_ids=[5, 17, 42, 99], max_total_tokens=20) as s:
        first = s.generate(max_tokens=10, ignore_eos=True, **GREEDY)
        assert first.completion.finish_reason == pb.FINISH_REASON_LENGTH
        assert first.state.budget_remaining == 6
        refused(
            lambda: s.append(token_ids=list(range(7))),
            grpc.StatusCode.FAILED_PRECONDITION,
            "SESSION_BUDGET",
        )
        s.append(token_ids=[1, 2])
        # asks for 100, gets the 4 that are left, and says why it ended
        clamped = s.generate(max_tokens=100, ignore_eos=True, **GREEDY)
        assert len(clamped.completion.token_ids) == 4
        assert clamped.completion.finish_reason == pb.FINISH_REASON_BUDGET
        why = refused(
            lambda: s.generate(max_tokens=1, **GREEDY),
            grpc.StatusCode.FAILED_PRECONDITION,
            "SESSION_BUDGET",
        )
        assert "20" in why and "0 left" in why
    limit = info_of(gen).max_model_len
    why = refused(
        lambda: gen.open_session(prompt_token_ids=[5], max_total_tokens=limit + 1),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
    )
    assert "max_total_tokens" in why and str(limit) in why
    refused(
        lambda: gen.open_session(prompt_token_ids=[5] * 10, max_total_tokens=10),
        grpc.StatusCode.FAILED_PRECONDITION,
        "SESSION_BUDGET",
    )


@pytest.fixture(scope="module")
def info_of():
    return lambda c: c.server_info()


# Longer than two of the CPU's 128-token KV blocks: its history is cached.
LONG = [(i * 37) % 400 + 20 for i in range(300)]


def test_updates_in_the_middle_of_trajectories(admin, gen):
    info = admin.server_info()
    old = info.weight_version
    with (
        gen.open_session(prompt_token_ids=LONG) as free,
        gen.open_session(prompt_token_ids=LONG, pin_weight_version=True) as pinned,
    ):
        assert pinned.opened.weight_version == old
        t1 = free.generate(max_tokens=8, ignore_eos=True, **GREEDY)
        pinned.generate(max_tokens=8, ignore_eos=True, **GREEDY)
        # between updates, the next turn reuses the history's cache
        t2 = free.generate(max_tokens=8, ignore_eos=True, **GREEDY)
        assert t2.usage.cached_prompt_tokens >= 256
        new = version()
        admin.update_weights(random_weights(info.parameters, seed=36), new)
        t3 = free.generate(max_tokens=8, ignore_eos=True, **GREEDY)
        assert t3.weight_version == new
        assert t3.usage.cached_prompt_tokens == 0, "KV computed under the old weights was reused"
        held = list(free.trajectory().token_ids)[: -len(t3.completion.token_ids)]
        fresh = gen.generate(prompt_token_ids=held, max_tokens=8, ignore_eos=True, **GREEDY)
        assert list(t3.completion.token_ids) == list(fresh.completions[0].token_ids)
        spans = [(v.weight_version, v.start, v.count) for v in free.trajectory().version_spans]
        n = len(LONG)
        assert spans == [(old, n, 16), (new, n + 16, 8)]
        assert [t1.weight_version, t2.weight_version] == [old, old]
        # the pinned session is refused before any token, and left as it was
        before = pinned.trajectory()
        refused(
            lambda: pinned.generate(max_tokens=8, **GREEDY),
            grpc.StatusCode.FAILED_PRECONDITION,
            "WRONG_WEIGHT_VERSION",
        )
        assert pinned.trajectory() == before
        assert before.pinned_weight_version == old
        # a turn's own required version: refused streamed or not, before any token
        for turn in (free.generate, lambda **kw: list(free.generate_stream(**kw))):
            held = free.trajectory()
            refused(
                lambda turn=turn: turn(max_tokens=8, required_weight_version=old, **GREEDY),
                grpc.StatusCode.FAILED_PRECONDITION,
                "WRONG_WEIGHT_VERSION",
            )
            assert free.trajectory() == held
        streamed = list(free.generate_stream(max_tokens=4, required_weight_version=new, **GREEDY))
        assert streamed[-1].delta.weight_version == new


def test_a_keep_update_inside_a_turn_tags_each_token_with_its_version(admin, gen):
    info = admin.server_info()
    old, new = info.weight_version, version()
    with gen.open_session(prompt_token_ids=LONG[:40]) as s:
        deltas: list[pb.GenerateStreamResponse] = []

        def turn():
            for m in s.generate_stream(max_tokens=1500, ignore_eos=True, **GREEDY):
                deltas.append(m.delta)

        runner = threading.Thread(target=turn)
        runner.start()
        while len(deltas) < 5 and runner.is_alive():
            time.sleep(0.01)
        admin.update_weights(
            random_weights(info.parameters, seed=37), new, pause_mode=pb.PAUSE_MODE_KEEP
        )
        runner.join(120)
        t = s.trajectory()
        turn_seg = t.segments[-1]
        assert turn_seg.count == 1500 and turn_seg.finish_reason == pb.FINISH_REASON_LENGTH
        spans = [(v.weight_version, v.start, v.count) for v in t.version_spans]
        assert [v for v, _, _ in spans] == [old, new], spans
        assert spans[0][1] == 40 and spans[0][2] + spans[1][2] == 1500 and spans[0][2] >= 5
        # what the stream said agrees with what the session holds
        streamed = [(v.weight_version, v.count) for d in deltas for v in d.version_spans if v.count]
        first_new = next(i for i, (v, _) in enumerate(streamed) if v == new)
        assert sum(c for _, c in streamed[:first_new]) == spans[0][2]


def _interrupt(client, session, rid: str, after: int, max_tokens: int) -> list[int]:
    """Streams a turn and aborts it after `after` deltas; its tokens."""
    got: list[int] = []
    for n, m in enumerate(
        session.generate_stream(request_id=rid, max_tokens=max_tokens, ignore_eos=True, **GREEDY)
    ):
        got.extend(m.delta.token_ids)
        if n + 1 == after:
            client.abort([rid])
        if m.HasField("state"):
            assert m.delta.finish_reason == pb.FINISH_REASON_ABORT
    return got


def _cancel(client, session, after: int, max_tokens: int) -> list[int]:
    """Streams a turn and cancels the call after `after` deltas; the tokens
    it saw. Returns once the session is free again."""
    request = pb.SessionGenerateStreamRequest(
        session_id=session.id,
        sampling_params=pb.SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0),
    )
    call = client.stub.SessionGenerateStream(request, metadata=client.options.metadata())
    seen: list[int] = []
    for n, m in enumerate(call):
        seen.extend(m.delta.token_ids)
        if n + 1 == after:
            call.cancel()
            break
    deadline = time.monotonic() + 30
    while session.trajectory().busy and time.monotonic() < deadline:
        time.sleep(0.02)
    return seen


def test_a_trajectory_interrupted_twice_equals_one_never_interrupted(gen):
    # Long enough that the Abort and the cancel land mid-turn on a fast host:
    # 300 tokens once ended before the Abort did (finish LENGTH, a CI run).
    total = 1500
    with gen.open_session(prompt_token_ids=LONG[:40]) as whole:
        straight = list(
            whole.generate(max_tokens=total, ignore_eos=True, **GREEDY).completion.token_ids
        )
    with gen.open_session(prompt_token_ids=LONG[:40]) as s:
        first = _interrupt(gen, s, "cut-1", 5, total)
        # the second time the client goes away: what the server sampled stays
        seen = _cancel(gen, s, 5, total)
        second = list(s.trajectory().token_ids)[40 + len(first) :]
        assert second[: len(seen)] == seen
        assert 0 < len(first) < total and 0 < len(second)
        t = s.trajectory()
        assert t.segments[-1].finish_reason == pb.FINISH_REASON_ABORT
        last = s.generate(max_tokens=total, ignore_eos=True, **GREEDY)
        assert last.state.resumed
        # max_tokens limits the whole turn: the resumption gets what is left
        assert len(first) + len(second) + len(last.completion.token_ids) == total
        t = s.trajectory()
        assert list(t.token_ids)[40:] == straight
        turn = t.segments[-1]
        assert turn.count == total and turn.finish_reason == pb.FINISH_REASON_LENGTH
        assert list(turn.resumed_at) == [len(first), len(first) + len(second)]


def _running_for(session, seconds: float) -> None:
    """Returns `seconds` after the session's turn began."""
    deadline = time.monotonic() + 30
    while not session.trajectory().busy and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(seconds)


def _free(session) -> None:
    deadline = time.monotonic() + 30
    while session.trajectory().busy and time.monotonic() < deadline:
        time.sleep(0.02)


def _whole_turn(session, request_id: str, max_tokens: int, answer: dict) -> None:
    answer["turn"] = session.generate(
        request_id=request_id, max_tokens=max_tokens, ignore_eos=True, **GREEDY
    )


def test_a_whole_turn_cut_keeps_every_token_it_sampled(gen):
    """A whole (unary) turn gets the engine's outputs only at its first token
    and at its end; cut in between by Abort, then by its client going away,
    the session still holds every token the engine sampled (not just the
    first), and the turn resumed after both ends where one never cut would."""
    total = 1500
    with gen.open_session(prompt_token_ids=LONG[:40]) as s:
        aborted: list[int] = []
        for wait in (0.3, 1.0, 3.0):  # until the cut comes after the first token
            answer: dict = {}
            runner = threading.Thread(target=_whole_turn, args=(s, "whole-cut", total, answer))
            runner.start()
            _running_for(s, wait)
            gen.abort(["whole-cut"])
            runner.join(60)
            completion = answer["turn"].completion
            assert completion.finish_reason == pb.FINISH_REASON_ABORT
            aborted = list(completion.token_ids)
            if aborted:
                break
        assert list(s.trajectory().token_ids)[40:] == aborted, (
            "the answer is what the session holds"
        )
        assert 1 < len(aborted) < total
        kept = [len(aborted)]  # tokens each cut kept
        for wait in (0.3, 0.6, 1.0):  # until the client goes after a second token
            before = len(s.trajectory().token_ids)
            request = pb.SessionGenerateRequest(
                session_id=s.id,
                sampling_params=pb.SamplingParams(max_tokens=total, ignore_eos=True, temperature=0),
            )
            call = gen.stub.SessionGenerate.future(request, metadata=gen.options.metadata())
            _running_for(s, wait)
            call.cancel()
            _free(s)
            if n := len(s.trajectory().token_ids) - before:
                kept.append(n)
            if n > 1:
                break
        cut = s.trajectory().segments[-1]
        assert cut.finish_reason == pb.FINISH_REASON_ABORT, "the turn was cut, not finished"
        assert kept[-1] > 1, f"the gone client's turn kept {kept[1:]} tokens a cut"
        last = s.generate(max_tokens=total, ignore_eos=True, **GREEDY)
        assert last.state.resumed
        assert sum(kept) + len(last.completion.token_ids) == total
        turn = s.trajectory().segments[-1]
        assert turn.count == total and turn.finish_reason == pb.FINISH_REASON_LENGTH
        assert list(turn.resumed_at) == list(itertools.accumulate(kept))


def test_sessions_belong_to_their_caller(gen, gen_b, admin):
    mine = gen.open_session(prompt_token_ids=[5, 6, 7])
    theirs = Session(gen_b, mine.opened)
    for call in (
        lambda: theirs.generate(max_tokens=2),
        lambda: theirs.append(token_ids=[1]),
        theirs.trajectory,
        theirs.close,
    ):
        refused(call, grpc.StatusCode.PERMISSION_DENIED, "SESSION_NOT_OWNED")
    assert list(mine.trajectory().token_ids) == [5, 6, 7], "the owner's session is untouched"
    # admin reads and ends any
    as_admin = Session(admin, mine.opened)
    assert list(as_admin.trajectory().token_ids) == [5, 6, 7]
    as_admin.close()
    refused(mine.trajectory, grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")


def test_sessions_per_caller_are_bounded_and_stated(gen_b):
    limits = gen_b.server_info().session_limits
    assert limits.max_sessions_per_caller == setup.MAX_PER_CALLER
    assert limits.bytes_per_held_token > 0 and limits.max_session_tokens > 0
    opened = [gen_b.open_session(prompt_token_ids=[5]) for _ in range(setup.MAX_PER_CALLER)]
    try:
        why = refused(
            lambda: gen_b.open_session(prompt_token_ids=[5]),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "LIMIT_EXCEEDED",
        )
        assert "--max-sessions-per-caller" in why
    finally:
        for s in opened:
            s.close()
    gen_b.open_session(prompt_token_ids=[5]).close()


def test_hostile_session_input_is_refused_naming_the_field(gen):
    vocab = gen.server_info().vocab_size
    deep = "[" * 100 + "]" * 100
    cases = [
        (lambda: gen.open_session(), "prompt_token_ids/prompt_text/messages"),
        (lambda: gen.open_session(prompt_token_ids=[vocab]), "prompt_token_ids[0]"),
        (
            lambda: gen.open_session(
                messages=[{"role": "user", "content": "x"}], tools_json=['{"a": ' + deep + "}"]
            ),
            "tools_json[0]",
        ),
        (lambda: gen.open_session(prompt_token_ids=[5], tools_json=["{}"]), "tools_json"),
    ]
    for call, field in cases:
        assert refused(call, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD").startswith(field)
    with gen.open_session(prompt_token_ids=[5, 6]) as s:
        for call, field in (
            (lambda: s.append(token_ids=[1, vocab + 7]), "token_ids[1]"),
            (lambda: s.append(), "token_ids/messages"),
            (lambda: s.generate(n=2), "sampling_params.n"),
            (lambda: s.generate(prompt_logprobs=1), "sampling_params.prompt_logprobs"),
        ):
            assert refused(call, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD").startswith(
                field
            )
        huge = [{"role": "tool", "content": "x" * 200_000}]
        refused(
            lambda: s.append(messages=huge), grpc.StatusCode.FAILED_PRECONDITION, "SESSION_BUDGET"
        )
        assert list(s.trajectory().token_ids) == [5, 6]
    for bad in ("", "../etc/passwd", "s" + "0" * 40):
        req = pb.GetSessionRequest(session_id=bad)
        refused(
            lambda req=req: gen._unary(gen.stub.GetSession, req, None),
            grpc.StatusCode.NOT_FOUND,
            "SESSION_NOT_FOUND",
        )
    # an id of another run of this server (s<server>-<run>-<key>): what a
    # restart leaves the client holding
    with gen.open_session(prompt_token_ids=[5]) as s:
        run = s.id[10:18]
        other = s.id[:10] + ("0" if run[0] != "0" else "1") + s.id[11:]
    why = refused(
        lambda: gen._unary(gen.stub.GetSession, pb.GetSessionRequest(session_id=other), None),
        grpc.StatusCode.NOT_FOUND,
        "SESSION_LOST",
    )
    assert "restarted" in why


def test_one_call_at_a_time_and_close_aborts_a_running_turn(gen):
    s = gen.open_session(prompt_token_ids=[5, 6, 7])
    out: dict = {}

    def long_turn():
        out["turn"] = s.generate(request_id="long", max_tokens=1500, ignore_eos=True, **GREEDY)

    runner = threading.Thread(target=long_turn)
    runner.start()
    deadline = time.monotonic() + 30
    while not s.trajectory().busy and time.monotonic() < deadline:
        time.sleep(0.02)
    refused(lambda: s.generate(max_tokens=2), grpc.StatusCode.ABORTED, "SESSION_BUSY")
    assert s.close().aborted_turn
    runner.join(60)
    assert out["turn"].completion.finish_reason == pb.FINISH_REASON_ABORT
    assert len(out["turn"].completion.token_ids) < 1500
    refused(s.trajectory, grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")


def test_an_idle_session_expires(gen):
    s = gen.open_session(prompt_token_ids=[5, 6])
    time.sleep(setup.IDLE_SECONDS + 1.5)
    why = refused(s.trajectory, grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")
    assert "expired" in why
    assert gen.server_info().open_sessions == 0


# A chat with a tool call and its result, as an OpenAI harness holds it.
TOOL_CHAT = [
    {"role": "user", "content": "Add 1 and 2."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
        ],
    },
    {"role": "tool", "content": "3", "tool_call_id": "c1"},
]


def test_get_session_returns_the_messages_each_segment_came_from_and_they_reopen_it(
    gen, hf_tokenizer
):
    """Tool calls and call ids in gRPC chat messages reach the template, and
    GetSession(include_messages) gives back what a copy needs to re-open the
    session elsewhere: the re-opened one renders the next append as the
    first does."""
    first = gen.open_session(messages=TOOL_CHAT, max_total_tokens=512)
    try:
        text = hf_tokenizer.decode(first.opened.prompt_token_ids)
        assert '<call>add {"a": 1}</call>' in text and "3[c1]" in text
        first.generate(max_tokens=4, ignore_eos=True, **GREEDY)
        first.append(messages=[{"role": "user", "content": "Thanks."}])

        copy = first.trajectory(include_messages=True)
        assert not first.trajectory().messages  # only when asked
        assert len(copy.messages) == len(copy.segments) == 4
        prompt, generation_prompt, turn, appended = (list(m.messages) for m in copy.messages)
        assert prompt[1].tool_calls[0] == pb.ToolCall(id="c1", name="add", arguments='{"a": 1}')
        assert prompt[2].tool_call_id == "c1"
        assert [m.role for m in prompt] == ["user", "assistant", "tool"]
        assert generation_prompt == turn == []
        assert [m.content[0].text for m in appended] == ["Thanks."]
        tail = first.trajectory(from_segment=3, include_messages=True)
        assert [list(m.messages) for m in tail.messages] == [appended]

        history = pb.SessionHistory(trajectory=copy, messages=copy.messages)
        del history.trajectory.messages[:]
        opened = gen._unary(
            gen.stub.OpenSession, pb.OpenSessionRequest(resume=history, max_total_tokens=512), 60
        )
        second = gen.session(opened.session_id)
        try:
            assert second.trajectory(include_messages=True).messages == copy.messages
            more = [{"role": "user", "content": "And 3 and 4?"}]
            assert list(second.append(messages=more).token_ids) == list(
                first.append(messages=more).token_ids
            )
        finally:
            second.close()
    finally:
        first.close()


def test_tool_call_arguments_nested_past_the_bound_are_refused_naming_them(gen):
    deep = {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": "[" * 100_000}}
    ]}  # fmt: skip
    details = refused(
        lambda: gen.open_session(messages=[deep]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
    )
    assert details.startswith("messages[0].tool_calls[0].arguments"), details
    no_name = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": ""}}]}
    details = refused(
        lambda: gen.generate(messages=[no_name], max_tokens=1),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
    )
    assert "messages[0].tool_calls[0].name" in details, details
    with gen.open_session(messages=TOOL_CHAT[:1]) as s:
        details = refused(
            lambda: s.append(messages=[no_name]), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD"
        )
        assert "messages[0].tool_calls[0].name" in details, details
