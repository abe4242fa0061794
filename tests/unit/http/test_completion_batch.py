"""A /v1/completions request of several prompts, without an engine
(rollout_service/http/batch.py, completions.py): the prompt's shape checked
before vLLM's model reads it, a batch refused whole past its caller's cap,
all or none (the first failure cancels the others before it is raised, naming
its prompt), streams merged with each message renumbered to its choice, and
one response whose choices carry their own weight versions; and, over the
pipeline with a stand-in engine, every prompt prepared before any runs, so a
refused prompt starts no engine request."""

from __future__ import annotations

import asyncio
import json
import threading
from contextlib import ExitStack
from types import SimpleNamespace

import pytest

from rollout.v1 import rollout_pb2 as pb
from rollout_service.fairness.identity import CallerId
from rollout_service.fairness.share import FairShare
from rollout_service.http import batch
from rollout_service.http.completions import (
    MAX_PROMPTS,
    CompletionCall,
    check_prompts,
    completion_response,
    prompts_of,
)
from rollout_service.status.errors import InvalidArgument, ResourceExhausted
from tests.support.stand_in_pipeline import final_output, stand_in_pipeline

A = CallerId("token:a", "generate", "generate:a")

REFUSED = [
    # (prompt, the field named, words of the message)
    ([], "prompt", "empty list"),
    (["hi"] * (MAX_PROMPTS + 1), "prompt", f"at most {MAX_PROMPTS} prompts"),
    (["hi", [1, 2]], "prompt[1]", "strings only, or lists of token ids only"),
    ([[1, 2], "hi"], "prompt[1]", "strings only, or lists of token ids only"),
    ([3, "hi"], "prompt[0]", "strings only, or lists of token ids only"),
    ([[1], [2, "x"]], "prompt[1][1]", "a token id"),
    ([[1], [[2]]], "prompt[1][0]", "a token id"),
    ([[1, True]], "prompt[0][1]", "a token id"),
    ([[1, -1]], "prompt[0][1]", "a token id"),
    ([1, 2.0], "prompt[1]", "a token id"),
    ([1 << 40], "prompt[0]", "a token id"),
    (["hi", ""], "prompt[1]", "is empty"),
    ([[1], []], "prompt[1]", "is empty"),
    ([{"a": 1}, "hi"], "prompt[0]", "strings only"),
]


@pytest.mark.parametrize(("prompt", "field", "words"), REFUSED, ids=range(len(REFUSED)))
def test_a_malformed_prompt_is_refused_naming_its_place(prompt, field, words):
    with pytest.raises(InvalidArgument) as refused:
        check_prompts(prompt)
    assert refused.value.field == field
    assert words in refused.value.message


def test_well_formed_prompts_are_one_prompt_or_a_batch():
    for prompt in ("hi", [1, 2], ["a", "b"], [[1], [2, 3]], ["hi"] * MAX_PROMPTS):
        check_prompts(prompt)
    assert prompts_of("hi") == ["hi"]
    assert prompts_of([1, 2]) == [[1, 2]]
    assert prompts_of(["a", "b"]) == ["a", "b"]
    assert prompts_of([[1], [2, 3]]) == [[1], [2, 3]]


def test_a_batch_past_its_callers_cap_is_refused_whole():
    fair = FairShare(True, {}, max_per_caller=3)
    batch.check_room(fair, A, 3)
    with pytest.raises(InvalidArgument) as never:
        batch.check_room(fair, A, 4)  # could never all be in flight
    assert never.value.field == "prompt" and "at most 3" in never.value.message
    with ExitStack() as stack:
        stack.enter_context(fair.slot(A))
        batch.check_room(fair, A, 2)
        with pytest.raises(ResourceExhausted) as full:
            batch.check_room(fair, A, 3)
        assert full.value.reason == pb.ERROR_REASON_CALLER_QUEUE_FULL
        assert full.value.retry_after
    batch.check_room(FairShare(True, {}, None), A, 100)  # no cap


def test_an_error_names_its_prompt():
    named = batch.of_prompt(InvalidArgument("prompt_token_ids[0]", "not in the vocabulary"), 1)
    assert (named.field, named.message) == ("prompt[1][0]", "prompt[1][0]: not in the vocabulary")
    text = batch.of_prompt(InvalidArgument("prompt_text", "too long"), 2)
    assert text.field == "prompt[2]"
    other = batch.of_prompt(InvalidArgument("sampling_params.max_tokens", "past the context"), 1)
    assert other.field == "sampling_params.max_tokens"
    assert other.message.endswith("past the context (prompt[1])")
    late = ResourceExhausted("busy")
    assert batch.of_prompt(late, 1) is late


def test_all_or_none_cancels_the_others_before_the_error():
    ended: list[str] = []

    async def long(name: str) -> str:
        try:
            await asyncio.sleep(60)
        finally:
            ended.append(name)
        return name

    async def refused() -> str:
        await asyncio.sleep(0.01)
        raise InvalidArgument("prompt_text", "too long")

    async def quick(name: str) -> str:
        return name

    with pytest.raises(InvalidArgument) as failed:
        asyncio.run(asyncio.wait_for(batch.all_or_none([long("a"), refused(), long("b")]), 10))
    assert failed.value.field == "prompt[1]"
    assert sorted(ended) == ["a", "b"]  # both cancelled before the error came out
    assert asyncio.run(batch.all_or_none([quick("x"), quick("y")])) == ["x", "y"]

    async def client_gone():
        task = asyncio.ensure_future(batch.all_or_none([long("c"), long("d")]))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(client_gone())
    assert sorted(ended) == ["a", "b", "c", "d"]


def _stream(name: str, deltas: int, ended: list[str], fail_at: int | None = None):
    async def messages():
        try:
            for k in range(deltas):
                await asyncio.sleep(0.001)
                if k == fail_at:
                    raise InvalidArgument("prompt_token_ids[0]", "not in the vocabulary")
                for j in range(2):  # n = 2
                    yield pb.GenerateStreamResponse(index=j, text=f"{name}{j}.{k}")
            await asyncio.sleep(60 if fail_at is not None else 0)
        finally:
            ended.append(name)

    return messages()


def test_merged_streams_renumber_their_choices_and_end_together():
    ended: list[str] = []

    async def read(streams, most=None):
        out = []
        merged = batch.merged(streams, 2)
        try:
            async for m in merged:
                out.append((m.index, m.text))
                if most is not None and len(out) == most:
                    break
        finally:
            await merged.aclose()
        return out

    got = asyncio.run(read([_stream("a", 3, ended), _stream("b", 2, ended)]))
    by_choice: dict[int, list[str]] = {}
    for index, text in got:
        by_choice.setdefault(index, []).append(text)
    assert by_choice == {
        0: ["a0.0", "a0.1", "a0.2"],
        1: ["a1.0", "a1.1", "a1.2"],
        2: ["b0.0", "b0.1"],
        3: ["b1.0", "b1.1"],
    }
    # The client goes after 3 messages: every prompt's stream is ended.
    ended.clear()
    asyncio.run(read([_stream("a", 50, ended), _stream("b", 50, ended)], most=3))
    assert sorted(ended) == ["a", "b"]
    # Prompt 1 fails: prompt 0, still running, has ended when its error comes.
    ended.clear()
    with pytest.raises(InvalidArgument) as failed:
        asyncio.run(read([_stream("a", 1, ended, fail_at=None), _stream("b", 3, ended, 1)]))
    assert failed.value.field == "prompt[1][0]"
    assert sorted(ended) == ["a", "b"]


def test_choices_carry_their_own_weight_version():
    """An update between the prompts' admissions: each choice says its
    version, and the response claims none for all (never one version for
    the tokens of another); on one version, the response says it too."""
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    request = CompletionRequest.model_validate({"prompt": [[5, 6], [7]], "n": 2})
    call = CompletionCall(
        request,
        [pb.GenerateRequest(request_id="r", prompt_token_ids=p) for p in ([5, 6], [7])],
    )

    def answer(version: str, text: str) -> pb.GenerateResponse:
        return pb.GenerateResponse(
            request_id="r",
            weight_version=version,
            completions=[pb.Completion(index=j, text=f"{text}{j}") for j in range(2)],
            usage=pb.Usage(prompt_tokens=2, completion_tokens=3, cached_prompt_tokens=1),
        )

    app = SimpleNamespace(tokenizing=None)
    mixed = completion_response(call, [answer("v1", "a"), answer("v2", "b")], "m", app)
    body = json.loads(mixed.model_dump_json())
    assert [(c["index"], c["text"], c["weight_version"]) for c in body["choices"]] == [
        (0, "a0", "v1"),
        (1, "a1", "v1"),
        (2, "b0", "v2"),
        (3, "b1", "v2"),
    ]
    assert body["weight_version"] == ""
    assert body["id"] == "cmpl-r"
    assert body["usage"]["prompt_tokens"] == 4 and body["usage"]["completion_tokens"] == 6
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 2
    same = completion_response(call, [answer("v2", "a"), answer("v2", "b")], "m", app)
    assert json.loads(same.model_dump_json())["weight_version"] == "v2"


class RecordingEngine:
    """A stand-in engine that answers every prompt with its own ids, in one
    final output, and records each request in `events` as it arrives."""

    errored = False

    def __init__(self, events: list[str]) -> None:
        self.events = events

    async def generate(self, prompt, params, request_id, **_):
        ids = prompt["prompt_token_ids"]
        self.events.append(f"engine {ids[0]}")
        yield final_output(ids, ids)


@pytest.fixture
def batch_pipeline():
    """The pipeline over a stand-in App (tests/support/stand_in_pipeline.py:
    max_model_len 64, vocabulary 100), its engine recording, and every
    request's conversion recorded with the thread it ran on."""
    events: list[str] = []
    generations = stand_in_pipeline(RecordingEngine(events), FairShare(True, {}, 8))
    convert = generations._convert
    threads: list[str] = []

    def recorded(request, kind, stream):
        events.append(f"prepare {request.prompt_token_ids[0]}")
        threads.append(threading.current_thread().name)
        return convert(request, kind, stream)

    generations._convert = recorded  # type: ignore[method-assign]
    yield generations, events, threads
    generations.app.tokenizing.close()


def _prompt(first: int, length: int = 3, **sampling) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id="batch",
        prompt_token_ids=[first] + [1] * (length - 1),
        sampling_params=pb.SamplingParams(max_tokens=2, **sampling),
    )


def test_every_prompt_is_prepared_before_any_runs(batch_pipeline):
    """Each prompt's checks and conversion, in order, before the first
    engine request; the answers in the prompts' order."""
    generations, events, _ = batch_pipeline
    answers = asyncio.run(batch.generate(generations, [_prompt(5), _prompt(6), _prompt(7)], A))
    assert [list(a.completions[0].token_ids)[0] for a in answers] == [5, 6, 7]
    assert events[:3] == ["prepare 5", "prepare 6", "prepare 7"]
    assert sorted(events[3:]) == ["engine 5", "engine 6", "engine 7"]
    assert not generations.app.fair.callers  # every slot given back


def test_a_refused_prompt_starts_no_engine_request(batch_pipeline):
    """prompt[1] too long (70 ids, max_model_len 64): the request fails
    naming it with no engine request made, nothing left registered for
    Abort and no slot held, and prompt[2] is not even prepared (its
    tokenizing is the expensive part); streamed, the same at the first
    message."""
    generations, events, _ = batch_pipeline
    prompts = [_prompt(5), _prompt(6, length=70), _prompt(7)]
    with pytest.raises(InvalidArgument) as refused:
        asyncio.run(batch.generate(generations, prompts, A))
    assert refused.value.field == "prompt[1]"
    assert events == ["prepare 5", "prepare 6"]
    assert not generations.calls._by_id and not generations.app.fair.callers

    events.clear()
    streams = [pb.GenerateStreamRequest.FromString(p.SerializeToString()) for p in prompts]

    async def first_message():
        messages = batch.stream(generations, streams, A, 1)
        try:
            return await anext(messages)
        finally:
            await messages.aclose()  # type: ignore[attr-defined]

    with pytest.raises(InvalidArgument) as refused:
        asyncio.run(first_message())
    assert refused.value.field == "prompt[1]"
    assert events == ["prepare 5", "prepare 6"]
    assert not generations.calls._by_id and not generations.app.fair.callers


def test_a_long_prompt_is_prepared_off_the_loop(batch_pipeline):
    """A prompt over the inline size (a 3 KiB stop string here) converts on
    the tokenizing thread, in a batch as alone; a small one on the loop."""
    generations, _, threads = batch_pipeline
    prompts = [_prompt(5, stop=["x" * 3072]), _prompt(6)]
    asyncio.run(batch.generate(generations, prompts, A))
    loop_thread = threading.main_thread().name
    assert threads[0] != loop_thread and threads[1] == loop_thread
