"""Synchronous and asyncio clients with the same surface.

Results are the rollout.v1 proto messages (documented in
proto/rollout/v1/rollout.proto). Failures raise `RolloutError`, which carries
the gRPC status code and the server's message.

    >>> client = RolloutClient("127.0.0.1:50051")            # doctest: +SKIP
    >>> client.wait_until_ready(timeout=120)                  # doctest: +SKIP
    >>> r = client.generate(prompt_text="Hello", max_tokens=8, temperature=0)  # doctest: +SKIP
    >>> r.completions[0].token_ids, r.weight_version          # doctest: +SKIP
    >>> client.update_weights(model.state_dict(), version="step-1")  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rollout.v1 import rollout_pb2 as pb
from rollout.v1 import rollout_pb2_grpc
from rollout_client import push
from rollout_client.push import DEFAULT_CHUNK_BYTES

# Leaves room for a 1 MiB chunk plus framing; the server's default is larger.
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20

_SAMPLING_FIELDS = {f.name for f in pb.SamplingParams.DESCRIPTOR.fields}


class RolloutError(Exception):
    """A failed call: `code` is the grpc.StatusCode, `details` the server's message."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details

    @classmethod
    def wrap(cls, e: grpc.RpcError) -> RolloutError:
        return cls(e.code(), e.details() or "")


def build_generate_request(
    prompt_text: str | None = None,
    prompt_token_ids: list[int] | None = None,
    images: list[bytes] | None = None,
    request_id: str = "",
    **sampling: Any,
) -> pb.GenerateRequest:
    """A GenerateRequest; keyword arguments are SamplingParams fields."""
    unknown = set(sampling) - _SAMPLING_FIELDS
    if unknown:
        raise TypeError(f"unknown sampling parameter(s): {sorted(unknown)}")
    return pb.GenerateRequest(
        request_id=request_id,
        prompt_text=prompt_text or "",
        prompt_token_ids=prompt_token_ids or [],
        images=[pb.Image(data=d) for d in images or []],
        sampling_params=pb.SamplingParams(**{k: v for k, v in sampling.items() if v is not None}),
    )


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc="UpdateWeights")


def _channel_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


@dataclass(frozen=True)
class ConnectionOptions:
    """How to reach the server: size limits, auth, TLS, retries.

    `token` is sent as `authorization: Bearer <token>` on every call. TLS is on
    when `root_certificates` is given (PEM bytes); add `certificate_chain` and
    `private_key` for mutual TLS. Unary calls that fail with UNAVAILABLE (server
    starting, restarting, shutting down) are retried `retries` times with
    exponential backoff from `backoff` seconds; nothing else is retried.
    """

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    token: str | None = None
    root_certificates: bytes | None = None
    certificate_chain: bytes | None = None
    private_key: bytes | None = None
    retries: int = 3
    backoff: float = 0.5

    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        return (("authorization", f"Bearer {self.token}"),) if self.token else None

    def credentials(self) -> grpc.ChannelCredentials | None:
        if self.root_certificates is None:
            return None
        return grpc.ssl_channel_credentials(
            self.root_certificates, self.private_key, self.certificate_chain
        )

    def channel(self, target: str, aio: bool, own_connection: bool = False):
        """A channel; with `own_connection`, one that shares no connection
        with the others (parallel uploads need one each)."""
        mod = grpc.aio if aio else grpc
        options = _channel_options(self.max_message_bytes)
        if own_connection:
            options.append(("grpc.use_local_subchannel_pool", 1))
        creds = self.credentials()
        if creds is None:
            return mod.insecure_channel(target, options=options)
        return mod.secure_channel(target, creds, options=options)

    def delays(self):
        """Seconds to wait before each retry."""
        return [self.backoff * 2**i for i in range(self.retries)]


class RolloutClient:
    """Blocking client. Every call takes `timeout` (seconds, the deadline)."""

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        timeout: float | None = 600.0,
        options: ConnectionOptions | None = None,
        **option_fields: Any,
    ) -> None:
        self.timeout = timeout
        self.target = target
        self.options = options or ConnectionOptions(**option_fields)
        self.channel = self.options.channel(target, aio=False)
        self._regions = push.Regions()  # same-host updates' mappings
        self.stub = rollout_pb2_grpc.RolloutServiceStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)

    def close(self) -> None:
        self.channel.close()
        self._regions.close()

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method, request, timeout: float | None):
        """`request` is a message, or a zero-argument factory of a request
        iterator (client streams are rebuilt for each attempt)."""
        for delay in [*self.options.delays(), None]:
            try:
                req = request() if callable(request) else request
                return method(
                    req, timeout=timeout or self.timeout, metadata=self.options.metadata()
                )
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or delay is None:
                    raise RolloutError.wrap(e) from None
                time.sleep(delay)

    def wait_until_ready(self, timeout: float = 300.0) -> None:
        """Polls health until SERVING; raises TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                r = self._health.Check(health_pb2.HealthCheckRequest(), timeout=5)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not SERVING after {timeout}s")
            time.sleep(0.5)

    def server_info(self, timeout: float | None = None) -> pb.GetServerInfoResponse:
        return self._call(self.stub.GetServerInfo, pb.GetServerInfoRequest(), timeout)

    def generate(self, *, timeout: float | None = None, **kwargs: Any) -> pb.GenerateResponse:
        """See `build_generate_request` for the arguments."""
        return self._call(self.stub.Generate, build_generate_request(**kwargs), timeout)

    def generate_stream(
        self, *, timeout: float | None = None, **kwargs: Any
    ) -> Iterator[pb.GenerateStreamResponse]:
        request = pb.GenerateStreamRequest.FromString(
            build_generate_request(**kwargs).SerializeToString()
        )
        try:
            yield from self.stub.GenerateStream(
                request, timeout=timeout or self.timeout, metadata=self.options.metadata()
            )
        except grpc.RpcError as e:
            raise RolloutError.wrap(e) from None

    def reset_caches(self, timeout: float | None = None) -> pb.ResetCachesResponse:
        return self._call(self.stub.ResetCaches, pb.ResetCachesRequest(), timeout)

    def update_weights(
        self,
        source: Any,
        version: str,
        *,
        pause_mode: int = pb.PAUSE_MODE_WAIT,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        checksum: bool = False,
        progress: bool = False,
        timeout: float | None = None,
        drain_timeout_seconds: float | None = None,
        streams: int = 1,
        same_host: bool = False,
    ) -> pb.UpdateWeightsResponse:
        """Sends `source` (a safetensors file or folder, a state_dict, a
        module or an iterable of (name, tensor)), read tensor by tensor,
        after checking it against the manifest. `streams` > 1 uploads over
        that many connections at once; `same_host` writes the bytes straight
        into the server's staging region (same host, /dev/shm and user).
        `drain_timeout_seconds` bounds the wait for in-flight calls (WAIT
        mode; see UpdateWeightsBegin). Retried like the other calls: a retry
        of an applied update returns its acknowledgement."""
        manifest = self.server_info(timeout).parameters
        u = push.prepare(
            source,
            version,
            manifest,
            pause_mode=pause_mode,
            chunk_bytes=chunk_bytes,
            checksum=checksum,
            drain_timeout_seconds=drain_timeout_seconds,
        )
        return self._push(u, progress, timeout, streams, same_host)

    def _push(self, u: push.Update, progress: bool, timeout, streams: int, on_host: bool):
        total = sum(t.nbytes for t in u.tensors)
        u.progress = _progress_bar(total, progress)
        u.timeout = timeout or self.timeout
        u.metadata = self.options.metadata()

        def new_channel():
            return self.options.channel(self.target, aio=False, own_connection=True)

        try:
            for delay in [*self.options.delays(), None]:
                try:
                    return push.send(
                        u, self.channel, new_channel, streams, on_host, self._regions
                    )
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.UNAVAILABLE or delay is None:
                        raise RolloutError.wrap(e) from None
                    time.sleep(delay)
        finally:
            if u.progress is not None:
                u.progress.close()


class AsyncRolloutClient:
    """asyncio client with the same methods as RolloutClient, awaited."""

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        timeout: float | None = 600.0,
        options: ConnectionOptions | None = None,
        **option_fields: Any,
    ) -> None:
        self.timeout = timeout
        self.target = target
        self.options = options or ConnectionOptions(**option_fields)
        self.channel = self.options.channel(target, aio=True)
        self.stub = rollout_pb2_grpc.RolloutServiceStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self._sync: RolloutClient | None = None  # for update_weights

    async def close(self) -> None:
        await self.channel.close()
        if self._sync is not None:
            self._sync.close()

    async def __aenter__(self) -> AsyncRolloutClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _call(self, method, request, timeout: float | None):
        for delay in [*self.options.delays(), None]:
            try:
                req = request() if callable(request) else request
                return await method(
                    req, timeout=timeout or self.timeout, metadata=self.options.metadata()
                )
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or delay is None:
                    raise RolloutError.wrap(e) from None
                await asyncio.sleep(delay)

    async def wait_until_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                r = await self._health.Check(health_pb2.HealthCheckRequest(), timeout=5)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not SERVING after {timeout}s")
            await asyncio.sleep(0.5)

    async def server_info(self, timeout: float | None = None) -> pb.GetServerInfoResponse:
        return await self._call(self.stub.GetServerInfo, pb.GetServerInfoRequest(), timeout)

    async def generate(self, *, timeout: float | None = None, **kwargs: Any) -> pb.GenerateResponse:
        return await self._call(self.stub.Generate, build_generate_request(**kwargs), timeout)

    async def generate_stream(
        self, *, timeout: float | None = None, **kwargs: Any
    ) -> AsyncIterator[pb.GenerateStreamResponse]:
        request = pb.GenerateStreamRequest.FromString(
            build_generate_request(**kwargs).SerializeToString()
        )
        try:
            call = self.stub.GenerateStream(
                request, timeout=timeout or self.timeout, metadata=self.options.metadata()
            )
            async for item in call:
                yield item
        except grpc.RpcError as e:
            raise RolloutError.wrap(e) from None

    async def reset_caches(self, timeout: float | None = None) -> pb.ResetCachesResponse:
        return await self._call(self.stub.ResetCaches, pb.ResetCachesRequest(), timeout)

    async def update_weights(
        self,
        source: Any,
        version: str,
        *,
        pause_mode: int = pb.PAUSE_MODE_WAIT,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        checksum: bool = False,
        progress: bool = False,
        timeout: float | None = None,
        drain_timeout_seconds: float | None = None,
        streams: int = 1,
        same_host: bool = False,
    ) -> pb.UpdateWeightsResponse:
        """RolloutClient.update_weights, run in a thread on a blocking
        client to the same target (the sending code is the same)."""
        if self._sync is None:
            self._sync = RolloutClient(self.target, timeout=self.timeout, options=self.options)
        return await asyncio.to_thread(
            self._sync.update_weights,
            source,
            version,
            pause_mode=pause_mode,
            chunk_bytes=chunk_bytes,
            checksum=checksum,
            progress=progress,
            timeout=timeout,
            drain_timeout_seconds=drain_timeout_seconds,
            streams=streams,
            same_host=same_host,
        )
