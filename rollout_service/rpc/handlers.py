"""gRPC method handlers: their registration, with lenient request
parsing and the error policy applied around each RPC (their shapes come from
ops/shapes.py, which the interceptors share)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Mapping

import grpc

from rollout.v1 import rollout_pb2 as pb
from rollout_codecs import wire
from rollout_service.ops.shapes import make_handler
from rollout_service.rpc.statuses import abort
from rollout_service.status.errors import InvalidArgument


class Malformed:
    """Stands in for a request whose bytes did not parse, so that the error
    policy answers INVALID_ARGUMENT instead of gRPC's UNKNOWN. It never gets
    past `_parsed`: no RPC sees one."""

    def __init__(self, message_type: str, error: Exception) -> None:
        self.message_type = message_type
        self.error = error

    def fail(self):
        raise InvalidArgument("request", f"malformed {self.message_type}: {self.error}")


# Chunk messages parsed without protobuf: the data stays a view of the
# received bytes instead of being copied into a message (wire.py).
_FAST_PARSERS = {
    "UpdateWeightsRequest": wire.parse_update_weights_chunk,
    "UploadChunksRequest": wire.parse_upload_chunk,
}


def _lenient(message_cls):
    from google.protobuf.message import DecodeError

    fast = _FAST_PARSERS.get(message_cls.DESCRIPTOR.name)

    def parse(data: bytes):
        if fast is not None:
            try:
                return fast(data)
            except wire.NotAChunk:
                pass
        try:
            return message_cls.FromString(data)
        except DecodeError as e:
            return Malformed(message_cls.DESCRIPTOR.full_name, e)

    return parse


def register(methods: Mapping[str, Callable], server) -> None:
    """Registers every RPC of the proto's RolloutService, each served by
    `methods[its name]` (servicer.py maps them), with deserializers that
    report malformed bytes as INVALID_ARGUMENT; each method is a registered
    method of the server as well as a generic handler's."""
    service = pb.DESCRIPTOR.services_by_name["RolloutService"]
    handlers = {
        m.name: make_handler(
            m.client_streaming,
            m.server_streaming,
            methods[m.name],
            _lenient(getattr(pb, m.input_type.name)),
            getattr(pb, m.output_type.name).SerializeToString,
        )
        for m in service.methods
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
    # Registered too (as grpc's generated add_*_to_server does): grpc.aio then
    # accepts each method's calls in a queue of its own, one call a loop pass;
    # with the generic handler alone all methods share one queue, and a control
    # call (GetServerInfo, Abort) waited behind every call another caller had
    # just sent (B's GetServerInfo behind A's 300 Tokenize calls: 93-341 ms,
    # 2-14 ms registered; benchmarks/fair_share.py, BENCHMARKS.md).
    server.add_registered_method_handlers(service.full_name, handlers)


# How long the calls a stop ends have to send their status (a task cancelled
# sends it at once; this bounds a handler that does not).
ENDED_SECONDS = 5.0


class Ending:
    """The calls running now, so that a server that stops (a signal, or its
    engine died) refuses new calls and ends the running ones with a status of
    its own, instead of gRPC's stop: that sends GOAWAY and cancels the calls
    that crossed it, and at the end of its grace the calls still running;
    their clients saw CANCELLED, which no retry policy retries
    (tests/engine/serving/test_shutdown.py, test_faults.py)."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task] = set()
        # Once set, what every new call is refused with (readiness.py) and
        # what `end_all` ends the running ones with.
        self.refusal: Callable[[], Exception] | None = None
        # The running calls `end_all` ended (a call whose own client went
        # away is cancelled too, and stays so).
        self.cut: set[asyncio.Task] = set()

    def refuse(self, refusal: Callable[[], Exception]) -> None:
        """From now on every new call is refused with `refusal()`."""
        self.refusal = refusal

    async def stop(
        self,
        refusal: Callable[[], Exception],
        drain_seconds: float,
        hurry: asyncio.Event | None = None,
    ) -> None:
        """The server's stop, in order: every new call refused with
        `refusal()`; the running ones given `drain_seconds` to finish (until
        `hurry` is set: a second signal); what still runs ended with
        `refusal()`; and up to ENDED_SECONDS for their statuses."""
        self.refuse(refusal)
        await self._running(drain_seconds, hurry)
        self.end_all(refusal)
        await self._running(ENDED_SECONDS)

    def end_all(self, refusal: Callable[[], Exception]) -> None:
        """Refuses new calls with `refusal()` and ends every running call with it."""
        self.refuse(refusal)
        self.cut |= self.tasks
        for task in list(self.tasks):
            task.cancel()

    async def _running(self, seconds: float, hurry: asyncio.Event | None = None) -> None:
        """Until every running call has ended, `seconds` have passed or
        `hurry` is set."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        hurried = asyncio.ensure_future((hurry or asyncio.Event()).wait())
        try:
            while self.tasks and not hurried.done() and (left := end - loop.time()) > 0:
                await asyncio.wait(
                    [*self.tasks, hurried], timeout=left, return_when="FIRST_COMPLETED"
                )
        finally:
            hurried.cancel()


@contextlib.asynccontextmanager
async def _policy(ending: Ending, context, rpc: str) -> AsyncIterator[None]:
    """Runs a call's body as one of `ending`'s tasks, its errors answered by
    the error policy (rpc/statuses.py); a cancellation passes (its client went
    away) unless `ending.end_all` ended the call."""
    task = asyncio.current_task()
    assert task is not None
    ending.tasks.add(task)
    try:
        yield
    except Exception as e:  # CancelledError is a BaseException: not here
        # Already ending with its own status: `ending.end_all` must not
        # cancel it half-way through sending it (its client would see
        # CANCELLED; an UNAVAILABLE from a dying engine was, in the suite).
        ending.tasks.discard(task)
        await abort(context, e, rpc)
    except asyncio.CancelledError:
        if task not in ending.cut or ending.refusal is None:
            raise
        await abort(context, ending.refusal(), rpc)
    finally:
        ending.tasks.discard(task)
        ending.cut.discard(task)


def _parsed(request):
    """The request, or for a client-streaming RPC its messages, as parsed
    messages: the one place a Malformed one becomes INVALID_ARGUMENT (the
    call ends; for a stream, at the message that did not parse)."""
    if isinstance(request, Malformed):
        request.fail()
    if hasattr(request, "__aiter__"):
        return _parsed_messages(request)
    return request


async def _parsed_messages(messages) -> AsyncIterator:
    async for message in messages:
        if isinstance(message, Malformed):
            message.fail()
        yield message


def unary(method):
    """Applies the error policy to a unary-response RPC."""

    @functools.wraps(method)
    async def wrapper(self, request, context):
        async with _policy(self.ending, context, method.__name__):
            return await method(self, _parsed(request), context)

    return wrapper


def streaming(method):
    """Applies the error policy inside a response-streaming RPC: its errors
    surface while it is iterated, so the handling sits in the generator."""

    @functools.wraps(method)
    async def wrapper(self, request, context):
        async with _policy(self.ending, context, method.__name__):
            async for item in method(self, _parsed(request), context):
                yield item

    return wrapper
