"""A /v1/completions request of several prompts (docs/openai.md): each prompt
is a generation of its own through the pipeline, exactly as a request of one
prompt is: all prepared first, then all run at once under the request's
caller.

- **The caller's cap.** A batch of k is k of its caller's calls: each takes
  its own slot (priority, engine seat) in the fair share. One that cannot
  fit under --max-requests-per-caller is refused whole before any work
  (`check_room`), not started in part.
- **Every prompt ready before any runs.** Each prompt takes its slot and
  is checked and tokenized (`Generations.ready`), in order, before any is
  registered or on the engine (`each_ready`), as `vllm serve` renders every
  prompt before it starts any: the first prompt refused fails the request,
  naming it, and no engine request exists.
- **All or none.** A prompt that fails after that (its gate, a wrong weight
  version, the engine) fails the request: the others are cancelled, their
  engine requests aborted, before the error is answered, as `vllm serve`
  answers the whole request with the error.
- **Streams** are merged as they come (`merged`), each message renumbered
  to its choice in the response (`i * n + j`, as vLLM numbers them); a
  client gone closes the merge, which cancels every prompt's generation.

A prompt's error names it: `prompt[1]` for a prompt the pipeline refused
(`prompt[1][0]` for its first token id), the prompt added to the message of
an error about another field (max_tokens within that prompt's context).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from rollout.v1 import rollout_pb2 as pb
from rollout_service.fairness.identity import CallerId
from rollout_service.fairness.share import RETRY_AFTER_SECONDS, FairShare
from rollout_service.http.errors import openai_field
from rollout_service.status.errors import InvalidArgument, ResourceExhausted

if TYPE_CHECKING:
    from rollout_service.pipeline.context import Ready
    from rollout_service.pipeline.generations import Generations

T = TypeVar("T")
Stream = AsyncGenerator[pb.GenerateStreamResponse, None]


def check_room(fair: FairShare, who: CallerId, prompts: int) -> None:
    """Refuses, before any work, a batch that cannot all be in flight under
    its caller's cap: 400 if it never could, 429 while the caller's other
    calls leave too little room (each prompt's slot checks again)."""
    cap = fair.max_per_caller
    if cap is None or prompts <= 1:
        return
    if prompts > cap:
        raise InvalidArgument(
            "prompt",
            f"{prompts} prompts, and this server lets a caller have {cap} generations in "
            f"flight (--max-requests-per-caller): send at most {cap}",
        )
    load = fair.callers.get(who.key)
    in_flight = load.in_flight if load is not None else 0
    if in_flight + prompts > cap:
        raise ResourceExhausted(
            f"this caller ({who.label}) has {in_flight} requests in flight and sent "
            f"{prompts} prompts, each a generation; the limit (--max-requests-per-caller) "
            f"is {cap}; retry after one ends",
            reason=pb.ERROR_REASON_CALLER_QUEUE_FULL,
            retry_after=RETRY_AFTER_SECONDS,
        )


def of_prompt(e: BaseException, index: int) -> BaseException:
    """`e` saying which prompt of the batch it is about (module docstring)."""
    if not isinstance(e, InvalidArgument):
        return e
    problem = e.message.removeprefix(f"{e.field}: ")
    named = openai_field(e.field, f"prompt[{index}]")
    if named.startswith(f"prompt[{index}]"):
        out = InvalidArgument(named, problem)
    else:
        out = InvalidArgument(e.field, f"{problem} (prompt[{index}])")
    out.reason = e.reason
    out.__cause__ = e
    return out


async def generate(
    generations: Generations, requests: Sequence[pb.GenerateRequest], who: CallerId
) -> list[pb.GenerateResponse]:
    """Every prompt's answer, in order: all ready (`each_ready`), then all
    run at once, all or none. One prompt is a Generate."""
    if len(requests) == 1:
        return [await generations.generate(requests[0], who)]
    async with each_ready(generations, requests, who) as ready:
        return await all_or_none([generations.answer(r) for r in ready])


def stream(
    generations: Generations, requests: Sequence[pb.GenerateStreamRequest], who: CallerId, n: int
) -> AsyncIterator[pb.GenerateStreamResponse]:
    """Every prompt's messages, merged (`merged`) once all are ready
    (`each_ready`): a prompt refused raises at the first message, before
    any is started. One prompt is a GenerateStream."""
    if len(requests) == 1:
        return generations.stream(requests[0], who)
    return _stream(generations, requests, who, n)


async def _stream(generations, requests, who, n: int) -> Stream:
    async with each_ready(generations, requests, who) as ready:
        async for message in merged([generations.streamed(r) for r in ready], n):
            yield message


@contextlib.asynccontextmanager
async def each_ready(
    generations: Generations,
    requests: Sequence[pb.GenerateRequest | pb.GenerateStreamRequest],
    who: CallerId,
) -> AsyncIterator[list[Ready]]:
    """Every prompt ready, in order (its slot, its checks and its tokens,
    off the loop: `Generations.ready`), their slots held until the context
    ends; the first refused raises its error naming it, none registered or
    on the engine (module docstring)."""
    async with contextlib.AsyncExitStack() as stack:
        ready = []
        for i, request in enumerate(requests):
            try:
                ready.append(await stack.enter_async_context(generations.ready(request, who)))
            except Exception as e:
                named = of_prompt(e, i)
                if named is e:
                    raise
                raise named from e
        yield ready


async def all_or_none(generations: list[Awaitable[T]]) -> list[T]:
    """Every generation's result, in order. The first to fail cancels the
    others, and they have ended (engine requests aborted) when its error,
    naming its prompt, is raised; a cancellation (client gone) ends them all
    the same way."""
    if len(generations) == 1:
        return [await generations[0]]
    tasks = [asyncio.ensure_future(g) for g in generations]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for i, task in enumerate(tasks):
            error = task.exception() if task.done() and not task.cancelled() else None
            if error is not None:
                raise of_prompt(error, i)
        return [task.result() for task in tasks]
    finally:
        await _ended(tasks)


def merged(streams: list[Stream], n: int) -> Stream:
    """The streams' messages as they come, each renumbered to its choice in
    the response (prompt i's completion j is choice i * n + j). One message
    a stream is awaited at a time, so a slow reader holds every stream back
    as it holds one. The first stream that fails ends the others (their
    engine requests aborted) before its error, naming its prompt, is
    raised; closing the merge (the client went away) ends them all. One
    stream is itself."""
    return streams[0] if len(streams) == 1 else _merged(streams, n)


async def _merged(streams: list[Stream], n: int) -> Stream:
    waiting = {asyncio.ensure_future(anext(s)): i for i, s in enumerate(streams)}
    try:
        while waiting:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=waiting.__getitem__):
                i = waiting.pop(task)
                error = task.exception()
                if isinstance(error, StopAsyncIteration):
                    continue  # this prompt's stream has ended
                if error is not None:
                    raise of_prompt(error, i)
                message = task.result()
                waiting[asyncio.ensure_future(anext(streams[i]))] = i
                message.index += i * n
                yield message
    finally:
        # A generation cancelled inside its pipeline call aborts its engine
        # request (Generations.run); awaited, so none outlives the merge.
        # One whose message was taken but not yet sent is closed as a
        # one-prompt stream is when its client goes (replies.streamed).
        await _ended(list(waiting))
        for stream in streams:
            with contextlib.suppress(Exception):
                await stream.aclose()


async def _ended(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancels the tasks still running and waits until all have ended."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: the first failure is the one raised
