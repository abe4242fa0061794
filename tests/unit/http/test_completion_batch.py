"""A /v1/completions request of several prompts, without an engine
(rollout_service/http/batch.py, completions.py): the prompt's shape checked
before vLLM's model reads it, a batch refused whole past its caller's cap,
all or none (the first failure cancels the others before it is raised, naming
its prompt), streams merged with each message renumbered to its choice, and
one response whose choices carry their own weight versions."""

from __future__ import annotations

import asyncio
import json
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
