"""GenerateMany: many generations on one stream, the deltas ready at each
send batched into one message.

Each request runs as GenerateStream would run it (`Generations.stream`,
generations.py), in a task of its own; whatever deltas and failures are ready
when the previous message has gone out leave in the next one. gRPC's cost is
per message, whatever it carries: a message per send instead of one per
completion per engine step is where the saving comes from (BENCHMARKS.md).
No generation holds anything for the stream: each is admitted through the
gate on its own, so an open stream never holds an update back.

What one stream can make the server hold is bounded (`StreamLimits`). A
running generation holds what the engine has produced and this process has
not yet converted: with top logprobs, vLLM keeps a few hundred bytes per
token and alternative, and the event loop converts slower than the engine
generates. 96 generations of 1900 tokens with 20 logprobs grew the server by
943 MiB when all ran at once, by 378 MiB within the default token budget
(1M), by 167 MiB within a quarter of it (and took twice as long). So a
generation starts only when
- fewer than `max_running` of the stream's run,
- the tokens the running ones may still hold, each counted as
  `max_tokens x n x (1 + logprobs)` (plus the prompt's with prompt_logprobs),
  stay within `token_budget` (a generation over it alone runs alone), and
- the deltas converted but not yet sent stay within `buffer_bytes` (a slow
  reader, or none);
and while the next request waits the stream is not read, so gRPC's flow
control holds the client's sends. No message grows past `batch_bytes` (under
the negotiated limit): what is ready beyond it leaves in the next message.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from rollout.v1 import rollout_pb2 as pb
from rollout_service.status.errors import InvalidArgument, as_rpc_error

_END = object()  # every generation has ended and the client has half-closed

Generation = Callable[[pb.GenerateStreamRequest], AsyncIterator[pb.GenerateStreamResponse]]


@dataclass(frozen=True)
class StreamLimits:
    """What one GenerateMany stream may make the server hold (module docstring)."""

    max_running: int = 256
    token_budget: int = 1 << 20
    buffer_bytes: int = 16 << 20
    batch_bytes: int = 4 << 20
    # A request's max_tokens when it sets none (the context length).
    max_model_len: int = 1 << 20

    @classmethod
    def for_server(
        cls, max_running: int, token_budget: int, max_message_bytes: int, max_model_len: int
    ) -> StreamLimits:
        # Half the message limit leaves room for a delta that alone is large.
        batch = min(4 << 20, max_message_bytes // 2)
        return cls(max_running, token_budget, 4 * batch, batch, max_model_len)

    def cost(self, request: pb.GenerateStreamRequest) -> int:
        """The most tokens and alternatives `request` can make the server
        hold (module docstring), from its fields alone: invalid values only
        make it large, and the generation then refuses them."""
        sp = request.sampling_params
        tokens = sp.max_tokens if sp.HasField("max_tokens") else self.max_model_len
        total = min(tokens, self.max_model_len) * max(1, sp.n) * (1 + sp.logprobs)
        if sp.HasField("prompt_logprobs"):
            total += self.max_model_len * (1 + sp.prompt_logprobs)
        return total


def failure(request_id: str, e: Exception) -> pb.GenerateFailure:
    """The status a GenerateStream failing with `e` would have ended with."""
    err = as_rpc_error(e, "GenerateMany")
    return pb.GenerateFailure(
        request_id=request_id, code=int(err.code), message=err.message, reason=err.reason
    )


class _Stream:
    """One GenerateMany call: its running generations and what is ready."""

    def __init__(self, generation: Generation, limits: StreamLimits) -> None:
        self.generation = generation
        self.limits = limits
        self.ready: deque[tuple[int, object]] = deque()  # (bytes, item)
        self.buffered = 0
        self.arrived = asyncio.Event()  # something was added to `ready`
        self.freed = asyncio.Event()  # a generation ended, or `ready` was taken
        self.held = 0  # the running generations' costs
        self.running: dict[str, asyncio.Task] = {}

    def put(self, item: object, size: int = 0) -> None:
        self.ready.append((size, item))
        self.buffered += size
        self.arrived.set()

    def take(self) -> list[object]:
        """What is ready, up to one message's worth (at least one item)."""
        items: list[object] = []
        size = 0
        while self.ready and (not items or size + self.ready[0][0] <= self.limits.batch_bytes):
            n, item = self.ready.popleft()
            size += n
            items.append(item)
        self.buffered -= size
        self.freed.set()
        if not self.ready:
            self.arrived.clear()
        return items

    async def _run(self, request: pb.GenerateStreamRequest, cost: int) -> None:
        try:
            async for delta in self.generation(request):
                # +8: the field's tag and length prefix inside the batch.
                self.put(delta, delta.ByteSize() + 8)
        except Exception as e:
            self.put(failure(request.request_id, e))
        finally:
            del self.running[request.request_id]
            self.held -= cost
            self.freed.set()

    def _full(self, cost: int) -> bool:
        limits = self.limits
        if self.buffered > limits.buffer_bytes:
            return True
        # With nothing running, even a generation over the budget may start.
        return bool(self.running) and (
            len(self.running) >= limits.max_running or self.held + cost > limits.token_budget
        )

    async def _start(self, request: pb.GenerateStreamRequest) -> None:
        """Starts a generation once the stream's limits allow it; until then
        the stream is not read further."""
        cost = self.limits.cost(request)
        while self._full(cost):
            self.freed.clear()
            await self.freed.wait()
        self.held += cost
        self.running[request.request_id] = asyncio.create_task(self._run(request, cost))

    async def read(self, requests) -> None:
        """Starts a generation per request; a message that breaks the stream's
        rules ends the whole call (the writer raises what it finds)."""
        try:
            async for message in requests:
                request = message.request
                rid = request.request_id
                if not rid:
                    raise InvalidArgument(
                        "request.request_id", "required in GenerateMany (it labels the deltas)"
                    )
                if rid in self.running:
                    raise InvalidArgument(
                        "request.request_id", f"{rid!r:.200} is already running on this stream"
                    )
                await self._start(request)
            while self.running:
                await asyncio.wait(list(self.running.values()))
            self.put(_END)
        except Exception as e:
            self.put(e)

    def cancel(self) -> list[asyncio.Task]:
        tasks = list(self.running.values())
        for task in tasks:
            task.cancel()
        return tasks


async def multiplex(
    requests, generation: Generation, limits: StreamLimits
) -> AsyncIterator[pb.GenerateManyResponse]:
    """The responses of one GenerateMany call (see the module docstring)."""
    stream = _Stream(generation, limits)
    reader = asyncio.create_task(stream.read(requests))
    try:
        while True:
            await stream.arrived.wait()
            deltas, failures, end = [], [], False
            for item in stream.take():
                if type(item) is pb.GenerateStreamResponse:
                    deltas.append(item)
                elif type(item) is pb.GenerateFailure:
                    failures.append(item)
                elif item is _END:
                    end = True
                elif isinstance(item, Exception):
                    raise item
            if deltas or failures:
                # One extend copies a batch faster than an append per delta.
                response = pb.GenerateManyResponse()
                response.deltas.extend(deltas)
                response.failures.extend(failures)
                yield response
            if end:
                return
    finally:
        # The client went away, broke the rules, or the call ended: nothing
        # of this stream keeps running (each cancelled generation aborts its
        # engine request inside AsyncLLM.generate).
        reader.cancel()
        tasks = stream.cancel()
        await asyncio.gather(reader, *tasks, return_exceptions=True)
