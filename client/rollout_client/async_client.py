"""The asyncio client: RolloutClient's methods, awaited, over one grpc.aio
channel (surface.py holds what both clients hold)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

import grpc

from rollout.v1 import rollout_pb2 as pb
from rollout.v1 import rollout_pb2_grpc
from rollout_client import sessions
from rollout_client.calls import core
from rollout_client.calls.connection import RolloutError
from rollout_client.calls.generate_request import (
    GenerateOptions,
    StreamOptions,
    build_generate_request,
    build_generate_stream_request,
)
from rollout_client.surface import Surface
from rollout_client.weights import interrupts, push, push_async, update_options, updates
from rollout_client.weights.update_options import UpdateOptions

if TYPE_CHECKING:  # numpy: imported by delta pushes only
    from rollout_client.weights.delta_push import PushedWeights

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


class AsyncRolloutClient(Surface[grpc.aio.Channel]):
    """asyncio client with the same methods as RolloutClient, awaited."""

    stub: rollout_pb2_grpc.RolloutServiceAsyncStub
    _regions: push.Regions | None = None  # same-host updates' mappings, kept
    # What update_weights(delta=True) pushed last (RolloutClient.pushed).
    pushed: PushedWeights | None = None

    async def close(self) -> None:
        await self.channel.close()
        if self._regions is not None:
            self._regions.close()

    async def __aenter__(self) -> AsyncRolloutClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _channel(self, own_connection: bool = False) -> grpc.aio.Channel:
        return self.options.channel(self.target, aio=True, own_connection=own_connection)

    async def _unary(
        self,
        method: grpc.aio.UnaryUnaryMultiCallable[_Req, _Resp],
        request: _Req,
        timeout: float | None,
    ) -> _Resp:
        with core.rpc_errors():
            return await method(request, **self._call_args(timeout))

    async def _health_status(self) -> int | RolloutError:
        try:
            call_args = self._call_args(core.HEALTH_TIMEOUT)
            response = await self._health.Check(core.HEALTH_CHECK, **call_args)
        except grpc.RpcError as e:
            return RolloutError.wrap(e)
        status: int = response.status
        return status

    async def wait_until_ready(
        self, timeout: float = 300.0, *, connect_grace: float | None = core.CONNECT_GRACE
    ) -> None:
        """See RolloutClient.wait_until_ready."""
        ready = core.Readiness(self.target, timeout, connect_grace)
        # Polls a remote server's health: no local event to wait on.
        while not ready.done(await self._health_status()):  # noqa: ASYNC110
            await asyncio.sleep(core.POLL_SECONDS)

    async def server_info(self, timeout: float | None = None) -> pb.GetServerInfoResponse:
        return await self._unary(self.stub.GetServerInfo, pb.GetServerInfoRequest(), timeout)

    async def generate(
        self, *, timeout: float | None = None, **options: Unpack[GenerateOptions]
    ) -> pb.GenerateResponse:
        """See RolloutClient.generate (the same options, the same request)."""
        request = build_generate_request(**options)
        return await self._unary(self.stub.Generate, request, timeout)

    def generate_stream(
        self, *, timeout: float | None = None, **options: Unpack[StreamOptions]
    ) -> AsyncIterator[pb.GenerateStreamResponse]:
        """See RolloutClient.generate_stream; iterate with `async for`."""
        request = build_generate_stream_request(**options)
        return self._stream(request, timeout)

    async def _stream(
        self, request: pb.GenerateStreamRequest, timeout: float | None
    ) -> AsyncIterator[pb.GenerateStreamResponse]:
        with core.rpc_errors():
            async for item in self.stub.GenerateStream(request, **self._call_args(timeout)):
                yield item

    async def generate_many(
        self,
        requests: Iterable[pb.GenerateStreamRequest] | AsyncIterable[pb.GenerateStreamRequest],
        *,
        timeout: float | None = None,
    ) -> AsyncIterator[pb.GenerateManyResponse]:
        """RolloutClient.generate_many; `requests` may be an async iterable
        (a trainer that submits prompts as it makes them)."""

        async def messages() -> AsyncIterator[pb.GenerateManyRequest]:
            if isinstance(requests, AsyncIterable):
                async for r in requests:
                    yield pb.GenerateManyRequest(request=r)
            else:
                for r in requests:
                    yield pb.GenerateManyRequest(request=r)

        with core.rpc_errors():
            async for item in self.stub.GenerateMany(messages(), **self._call_args(timeout)):
                yield item

    async def reset_caches(self, timeout: float | None = None) -> pb.ResetCachesResponse:
        return await self._unary(self.stub.ResetCaches, pb.ResetCachesRequest(), timeout)

    async def update_weights(
        self, source: Any, version: str, **options: Unpack[UpdateOptions]
    ) -> pb.UpdateWeightsResponse:
        """RolloutClient.update_weights over this client's grpc.aio channel
        (and, with `streams` > 1, as many more): the same update
        (updates.prepare_update) and messages (push.py), each made in a worker
        thread, so the event loop is never blocked (push_async.py); with
        `delta`, the blocking client's choice and record (delta_push.py, CPU
        work) run in a worker thread and each send on this channel (its
        `pushed` is this client's record). Cancelled (Ctrl-C under
        asyncio.run, a timeout), the push stops and the CancelledError
        carries a note: whether the update may have been applied, and how to
        check (interrupts.py)."""
        update_options.check(options)
        state = interrupts.PushState()
        target = updates.adapter_target(options.get("adapter"), options.get("adapter_config"))
        if options.get("delta"):
            if target is not None:
                raise ValueError("delta=True applies to the base weights, not to an adapter")
            return await self._update_delta(source, version, options, state)
        with interrupts.noted(state, version):
            info = None if target else await self.server_info(options.get("timeout"))
            prepare = self._preparing(source, version, info, options, target, state)
            # Off the loop: opening a source reads headers, checksum=True every byte.
            u = await asyncio.to_thread(prepare)
            return await self._send(u, options.get("streams", 1), options.get("same_host", False))

    async def _update_delta(
        self, source: Any, version: str, options: UpdateOptions, state: interrupts.PushState
    ) -> pb.UpdateWeightsResponse:
        """RolloutClient._update_delta's push (delta_push.push_cheaper) in a
        worker thread, each of its sends run on this client's channel in the
        event loop (and cancelled when the push is stopped)."""
        from rollout_client.weights import delta_push

        if self.pushed is None:
            self.pushed = delta_push.PushedWeights()
        pushed = self.pushed
        with interrupts.noted(state, version):
            info = await self.server_info(options.get("timeout"))
        prepare = self._preparing(source, version, info, options, None, state)
        has_base = bool(pushed.version) and pushed.version == info.delta_base_version
        transport = (options.get("streams", 1), options.get("same_host", False))
        always = options.get("delta") == "always"
        loop = asyncio.get_running_loop()

        def send(update: push.Update) -> pb.UpdateWeightsResponse:
            sending = asyncio.run_coroutine_threadsafe(self._send(update, *transport), loop)
            state.on_stop(sending.cancel)
            return sending.result()

        def push_delta() -> pb.UpdateWeightsResponse:
            u = prepare()
            return delta_push.push_cheaper(pushed, u, has_base, transport, send, always)

        return await interrupts.in_thread(state, version, push_delta)

    async def _send(
        self, u: push.Update, streams: int, same_host: bool
    ) -> pb.UpdateWeightsResponse:
        if same_host and self._regions is None:
            self._regions = push.Regions()
        new_channel = functools.partial(self._channel, own_connection=True)
        return await push_async.send(
            u, self.channel, self.options, new_channel, streams, same_host, self._regions
        )

    async def remove_adapter(
        self, name: str, version: str, *, timeout: float | None = None
    ) -> pb.UpdateWeightsResponse:
        with core.rpc_errors():
            return await self.stub.UpdateWeights(
                iter(updates.adapter_removal(name, version)), **self._call_args(timeout)
            )

    async def abort(
        self, request_ids: Iterable[str] = (), *, all: bool = False, timeout: float | None = None
    ) -> pb.AbortResponse:
        request = core.build_abort_request(request_ids, all)
        return await self._unary(self.stub.Abort, request, timeout)

    async def tokenize(self, *, timeout: float | None = None, **kwargs: Any) -> pb.TokenizeResponse:
        request = core.build_tokenize_request(**kwargs)
        return await self._unary(self.stub.Tokenize, request, timeout)

    async def detokenize(
        self,
        token_ids: Iterable[int],
        *,
        skip_special_tokens: bool = False,
        timeout: float | None = None,
    ) -> pb.DetokenizeResponse:
        request = pb.DetokenizeRequest(
            token_ids=list(token_ids), skip_special_tokens=skip_special_tokens
        )
        return await self._unary(self.stub.Detokenize, request, timeout)

    async def sleep(self, level: int = 1, *, timeout: float | None = None) -> pb.SleepResponse:
        return await self._unary(self.stub.Sleep, pb.SleepRequest(level=level), timeout)

    async def open_session(
        self, *, timeout: float | None = None, **kwargs: Any
    ) -> sessions.AsyncSession:
        """See RolloutClient.open_session."""
        request = sessions.build_open_request(**kwargs)
        opened = await self._unary(self.stub.OpenSession, request, timeout)
        return sessions.AsyncSession(self, opened)

    def session(self, session_id: str) -> sessions.AsyncSession:
        """See RolloutClient.session."""
        return sessions.AsyncSession(self, pb.OpenSessionResponse(session_id=session_id))

    async def wake_up(self, *, timeout: float | None = None) -> pb.WakeUpResponse:
        return await self._unary(self.stub.WakeUp, pb.WakeUpRequest(), timeout)
