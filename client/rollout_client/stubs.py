"""The generated service stub, typed.

rollout_pb2_grpc (grpcio-tools) carries no annotations and grpcio ships no
stubs, so each method the client calls is declared here once with its
request and response messages: a call then checks its request and returns a
typed message. The generated `RolloutServiceStub` is both `RolloutStub` (over
a grpc channel) and `AsyncRolloutStub` (over a grpc.aio channel).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Iterable, Iterator
from typing import Protocol, TypeVar

from rollout.v1 import rollout_pb2 as pb

_Req = TypeVar("_Req", contravariant=True)
_Resp = TypeVar("_Resp", covariant=True)

# ConnectionOptions.metadata(): the authorization header, or None.
Metadata = tuple[tuple[str, str], ...] | None


class Unary(Protocol[_Req, _Resp]):
    def __call__(
        self, request: _Req, *, timeout: float | None = ..., metadata: Metadata = ...
    ) -> _Resp: ...


class UnaryStream(Protocol[_Req, _Resp]):
    def __call__(
        self, request: _Req, *, timeout: float | None = ..., metadata: Metadata = ...
    ) -> Iterator[_Resp]: ...


class CallFuture(Protocol[_Resp]):
    """A call started without blocking (grpc.Future): its outcome, or cancel it."""

    def result(self, timeout: float | None = ...) -> _Resp: ...

    def cancel(self) -> bool: ...


class StreamUnary(Protocol[_Req, _Resp]):
    def __call__(
        self, requests: Iterator[_Req], *, timeout: float | None = ..., metadata: Metadata = ...
    ) -> _Resp: ...

    def future(
        self, requests: Iterator[_Req], *, timeout: float | None = ..., metadata: Metadata = ...
    ) -> CallFuture[_Resp]: ...


class StreamStream(Protocol[_Req, _Resp]):
    def __call__(
        self, requests: Iterator[_Req], *, timeout: float | None = ..., metadata: Metadata = ...
    ) -> Iterator[_Resp]: ...


class AsyncUnary(Protocol[_Req, _Resp]):
    def __call__(
        self, request: _Req, *, timeout: float | None = ..., metadata: Metadata = ...
    ) -> Awaitable[_Resp]: ...


class AsyncUnaryStream(Protocol[_Req, _Resp]):
    def __call__(
        self, request: _Req, *, timeout: float | None = ..., metadata: Metadata = ...
    ) -> AsyncIterator[_Resp]: ...


class AsyncStreamUnary(Protocol[_Req, _Resp]):
    def __call__(
        self,
        requests: Iterable[_Req] | AsyncIterable[_Req],
        *,
        timeout: float | None = ...,
        metadata: Metadata = ...,
    ) -> Awaitable[_Resp]: ...


class AsyncStreamStream(Protocol[_Req, _Resp]):
    def __call__(
        self,
        requests: Iterable[_Req] | AsyncIterable[_Req],
        *,
        timeout: float | None = ...,
        metadata: Metadata = ...,
    ) -> AsyncIterator[_Resp]: ...


class RolloutStub(Protocol):
    """rollout.v1.RolloutService over a blocking channel: the methods the client calls."""

    Generate: Unary[pb.GenerateRequest, pb.GenerateResponse]
    GenerateStream: UnaryStream[pb.GenerateStreamRequest, pb.GenerateStreamResponse]
    GenerateMany: StreamStream[pb.GenerateManyRequest, pb.GenerateManyResponse]
    UpdateWeights: StreamUnary[pb.UpdateWeightsRequest, pb.UpdateWeightsResponse]
    BeginUpdate: Unary[pb.BeginUpdateRequest, pb.BeginUpdateResponse]
    GetUpdateStatus: Unary[pb.GetUpdateStatusRequest, pb.GetUpdateStatusResponse]
    CommitUpdate: Unary[pb.CommitUpdateRequest, pb.CommitUpdateResponse]
    AbortUpdate: Unary[pb.AbortUpdateRequest, pb.AbortUpdateResponse]
    ResetCaches: Unary[pb.ResetCachesRequest, pb.ResetCachesResponse]
    GetServerInfo: Unary[pb.GetServerInfoRequest, pb.GetServerInfoResponse]
    Abort: Unary[pb.AbortRequest, pb.AbortResponse]
    Tokenize: Unary[pb.TokenizeRequest, pb.TokenizeResponse]
    Detokenize: Unary[pb.DetokenizeRequest, pb.DetokenizeResponse]
    Sleep: Unary[pb.SleepRequest, pb.SleepResponse]
    WakeUp: Unary[pb.WakeUpRequest, pb.WakeUpResponse]
    OpenSession: Unary[pb.OpenSessionRequest, pb.OpenSessionResponse]
    SessionGenerate: Unary[pb.SessionGenerateRequest, pb.SessionGenerateResponse]
    SessionGenerateStream: UnaryStream[
        pb.SessionGenerateStreamRequest, pb.SessionGenerateStreamResponse
    ]
    AppendToSession: Unary[pb.AppendToSessionRequest, pb.AppendToSessionResponse]
    GetSession: Unary[pb.GetSessionRequest, pb.GetSessionResponse]
    CloseSession: Unary[pb.CloseSessionRequest, pb.CloseSessionResponse]


class AsyncRolloutStub(Protocol):
    """The same over a grpc.aio channel: every call is awaited or iterated asynchronously."""

    Generate: AsyncUnary[pb.GenerateRequest, pb.GenerateResponse]
    GenerateStream: AsyncUnaryStream[pb.GenerateStreamRequest, pb.GenerateStreamResponse]
    GenerateMany: AsyncStreamStream[pb.GenerateManyRequest, pb.GenerateManyResponse]
    UpdateWeights: AsyncStreamUnary[pb.UpdateWeightsRequest, pb.UpdateWeightsResponse]
    BeginUpdate: AsyncUnary[pb.BeginUpdateRequest, pb.BeginUpdateResponse]
    GetUpdateStatus: AsyncUnary[pb.GetUpdateStatusRequest, pb.GetUpdateStatusResponse]
    CommitUpdate: AsyncUnary[pb.CommitUpdateRequest, pb.CommitUpdateResponse]
    AbortUpdate: AsyncUnary[pb.AbortUpdateRequest, pb.AbortUpdateResponse]
    ResetCaches: AsyncUnary[pb.ResetCachesRequest, pb.ResetCachesResponse]
    GetServerInfo: AsyncUnary[pb.GetServerInfoRequest, pb.GetServerInfoResponse]
    Abort: AsyncUnary[pb.AbortRequest, pb.AbortResponse]
    Tokenize: AsyncUnary[pb.TokenizeRequest, pb.TokenizeResponse]
    Detokenize: AsyncUnary[pb.DetokenizeRequest, pb.DetokenizeResponse]
    Sleep: AsyncUnary[pb.SleepRequest, pb.SleepResponse]
    WakeUp: AsyncUnary[pb.WakeUpRequest, pb.WakeUpResponse]
    OpenSession: AsyncUnary[pb.OpenSessionRequest, pb.OpenSessionResponse]
    SessionGenerate: AsyncUnary[pb.SessionGenerateRequest, pb.SessionGenerateResponse]
    SessionGenerateStream: AsyncUnaryStream[
        pb.SessionGenerateStreamRequest, pb.SessionGenerateStreamResponse
    ]
    AppendToSession: AsyncUnary[pb.AppendToSessionRequest, pb.AppendToSessionResponse]
    GetSession: AsyncUnary[pb.GetSessionRequest, pb.GetSessionResponse]
    CloseSession: AsyncUnary[pb.CloseSessionRequest, pb.CloseSessionResponse]
