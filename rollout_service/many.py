"""GenerateMany: many generations on one stream, the deltas ready at each
send batched into one message.

Each request runs as GenerateStream would run it (the servicer's
`_generation`), in a task of its own; whatever deltas and failures are ready
when the previous message has gone out leave in the next one. gRPC's cost is
per message, whatever it carries: a message per send instead of one per
completion per engine step is where the saving comes from (BENCHMARKS.md).
No generation holds anything for the stream: each is admitted through the
gate on its own, so an open stream never holds an update back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from rollout.v1 import rollout_pb2 as pb
from rollout_service.errors import InvalidArgument, as_rpc_error
from rollout_service.rpc_handlers import Malformed

_END = object()  # every generation has ended and the client has half-closed

Generation = Callable[[pb.GenerateStreamRequest], AsyncIterator[pb.GenerateStreamResponse]]


def failure(request_id: str, e: Exception) -> pb.GenerateFailure:
    """The status a GenerateStream failing with `e` would have ended with."""
    err = as_rpc_error(e, "GenerateMany")
    return pb.GenerateFailure(
        request_id=request_id, code=err.code.value[0], message=err.message, reason=err.reason
    )


class _Stream:
    """One GenerateMany call: its running generations and what is ready."""

    def __init__(self, generation: Generation) -> None:
        self.generation = generation
        self.ready: asyncio.Queue = asyncio.Queue()
        self.running: dict[str, asyncio.Task] = {}

    async def _run(self, request: pb.GenerateStreamRequest) -> None:
        try:
            async for delta in self.generation(request):
                self.ready.put_nowait(delta)
        except Exception as e:
            self.ready.put_nowait(failure(request.request_id, e))
        finally:
            del self.running[request.request_id]

    async def read(self, requests) -> None:
        """Starts a generation per request; a message that breaks the stream's
        rules ends the whole call (the writer raises what it finds)."""
        try:
            async for message in requests:
                if isinstance(message, Malformed):
                    message.fail()
                request = message.request
                rid = request.request_id
                if not rid:
                    raise InvalidArgument(
                        "request.request_id", "required in GenerateMany (it labels the deltas)"
                    )
                if rid in self.running:
                    raise InvalidArgument(
                        "request.request_id", f"{rid!r} is already running on this stream"
                    )
                self.running[rid] = asyncio.create_task(self._run(request))
            while self.running:
                await asyncio.wait(list(self.running.values()))
            self.ready.put_nowait(_END)
        except Exception as e:
            self.ready.put_nowait(e)

    def cancel(self) -> list[asyncio.Task]:
        tasks = list(self.running.values())
        for task in tasks:
            task.cancel()
        return tasks


async def multiplex(requests, generation: Generation) -> AsyncIterator[pb.GenerateManyResponse]:
    """The responses of one GenerateMany call (see the module docstring)."""
    stream = _Stream(generation)
    reader = asyncio.create_task(stream.read(requests))
    try:
        while True:
            items = [await stream.ready.get()]
            while not stream.ready.empty():
                items.append(stream.ready.get_nowait())
            deltas, failures = [], []
            for item in items:
                if type(item) is pb.GenerateStreamResponse:
                    deltas.append(item)
                elif type(item) is pb.GenerateFailure:
                    failures.append(item)
                elif isinstance(item, Exception):
                    raise item
            if deltas or failures:
                # One extend copies a batch faster than an append per delta.
                response = pb.GenerateManyResponse()
                response.deltas.extend(deltas)
                response.failures.extend(failures)
                yield response
            if items[-1] is _END:
                return
    finally:
        # The client went away, broke the rules, or the call ended: nothing
        # of this stream keeps running (each cancelled generation aborts its
        # engine request inside AsyncLLM.generate).
        reader.cancel()
        tasks = stream.cancel()
        await asyncio.gather(reader, *tasks, return_exceptions=True)
