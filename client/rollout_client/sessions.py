"""Sessions from Python: one trajectory the server holds, token for token.

    >>> with client.open_session(messages=[{"role": "user", "content": "2+2?"}],
    ...                          max_total_tokens=1024) as s:        # doctest: +SKIP
    ...     turn = s.generate(max_tokens=64, temperature=1.0)
    ...     s.append(messages=[{"role": "tool", "content": "4"}])
    ...     s.generate(max_tokens=64)
    ...     t = s.trajectory()   # token_ids, sources, logprobs, version_spans
    ...     mask = loss_mask(t)  # 1 for sampled tokens

`Session` is the blocking one (RolloutClient.open_session), `AsyncSession`
the asyncio one (AsyncRolloutClient.open_session); both build their
requests here and differ only in how the call is made.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar, Unpack

import grpc

from rollout.v1 import rollout_pb2 as pb
from rollout.v1 import rollout_pb2_grpc
from rollout_client.calls import core
from rollout_client.calls.generate_request import Sampling

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


class Calls(Protocol):
    """What a Session needs of its RolloutClient (the client's own calls,
    so that this module does not import the client that imports it)."""

    @property
    def stub(self) -> rollout_pb2_grpc.RolloutServiceStub: ...

    def _unary(
        self,
        method: grpc.UnaryUnaryMultiCallable[_Req, _Resp],
        request: _Req,
        timeout: float | None,
    ) -> _Resp: ...

    def _call_args(self, timeout: float | None) -> dict[str, Any]: ...


class AsyncCalls(Protocol):
    """What an AsyncSession needs of its AsyncRolloutClient."""

    @property
    def stub(self) -> rollout_pb2_grpc.RolloutServiceAsyncStub: ...

    async def _unary(
        self,
        method: grpc.aio.UnaryUnaryMultiCallable[_Req, _Resp],
        request: _Req,
        timeout: float | None,
    ) -> _Resp: ...

    def _call_args(self, timeout: float | None) -> dict[str, Any]: ...


_HISTORY_RULES = {"refuse": pb.HISTORY_RULE_REFUSE, "restart": pb.HISTORY_RULE_RESTART}


def build_open_request(
    prompt_token_ids: Sequence[int] | None = None,
    prompt_text: str | None = None,
    messages: Sequence[Any] | None = None,
    tools_json: Sequence[str] = (),
    max_total_tokens: int | None = None,
    lora_adapter: str = "",
    pin_weight_version: bool = False,
    isolated_render: bool = False,
    history_rule: Literal["refuse", "restart"] = "refuse",
) -> pb.OpenSessionRequest:
    """An OpenSessionRequest; `messages` as core.chat_messages takes them,
    `isolated_render` for templates that rewrite history (APPEND_RENDER_ISOLATED),
    `history_rule` what the session's base URL (`opened.base_url`, with the
    server's --http-port) does with a chat whose messages do not extend the
    held ones: refuse it, or restart the context from it (HistoryRule)."""
    if history_rule not in _HISTORY_RULES:
        raise ValueError(f"history_rule: {history_rule!r} is not one of {sorted(_HISTORY_RULES)}")
    request = pb.OpenSessionRequest(
        prompt_token_ids=list(prompt_token_ids or []),
        prompt_text=prompt_text or "",
        messages=core.chat_messages(messages or []),
        tools_json=list(tools_json),
        lora_adapter=lora_adapter,
        pin_weight_version=pin_weight_version,
        append_render=pb.APPEND_RENDER_ISOLATED if isolated_render else pb.APPEND_RENDER_WHOLE,
        history_rule=_HISTORY_RULES[history_rule],
    )
    if max_total_tokens is not None:
        request.max_total_tokens = max_total_tokens
    return request


def build_turn_request(
    session_id: str, request_id: str, params: Mapping[str, Any], required_weight_version: str = ""
) -> pb.SessionGenerateRequest:
    """A SessionGenerateRequest; `params` are SamplingParams fields."""
    return pb.SessionGenerateRequest(
        session_id=session_id,
        request_id=request_id,
        sampling_params=core.sampling_params(params),
        required_weight_version=required_weight_version,
    )


def build_stream_request(
    session_id: str,
    request_id: str,
    delta_tokens: int,
    omit_text: bool,
    params: Mapping[str, Any],
    required_weight_version: str = "",
) -> pb.SessionGenerateStreamRequest:
    """The same turn streamed, with its StreamOptions."""
    return pb.SessionGenerateStreamRequest(
        session_id=session_id,
        request_id=request_id,
        sampling_params=core.sampling_params(params),
        stream_options=pb.StreamOptions(delta_tokens=delta_tokens, omit_text=omit_text),
        required_weight_version=required_weight_version,
    )


def build_append_request(
    session_id: str, token_ids: Sequence[int] | None = None, messages: Sequence[Any] | None = None
) -> pb.AppendToSessionRequest:
    return pb.AppendToSessionRequest(
        session_id=session_id,
        token_ids=list(token_ids or []),
        messages=core.chat_messages(messages or []),
    )


def merge_tail(whole: pb.GetSessionResponse, tail: pb.GetSessionResponse, k: int) -> None:
    """Brings `whole` (a trajectory read before) up to date with `tail`, a
    read of the same session with from_segment=`k` (at most whole's segment
    count): what whole held from segment k on is replaced."""
    first = whole.segments[k].start if k < len(whole.segments) else len(whole.token_ids)
    for name in ("token_ids", "sources", "logprobs"):
        del getattr(whole, name)[first:]
        getattr(whole, name).extend(getattr(tail, name))
    del whole.segments[k:]
    whole.segments.extend(tail.segments)
    kept = [s for s in whole.version_spans if s.start + s.count <= first]
    del whole.version_spans[:]
    whole.version_spans.extend(kept)
    whole.version_spans.extend(tail.version_spans)
    # Aligned with the segments when every read asked for them (include_messages).
    del whole.messages[k:]
    whole.messages.extend(tail.messages)
    whole.session_id = tail.session_id
    whole.max_total_tokens = tail.max_total_tokens
    whole.pinned_weight_version = tail.pinned_weight_version
    whole.busy = tail.busy
    whole.resumed_tokens = tail.resumed_tokens


def loss_mask(trajectory: pb.GetSessionResponse) -> list[int]:
    """1 for each sampled token, 0 for prompt and appended ones."""
    return [int(s == pb.TOKEN_SOURCE_SAMPLED) for s in trajectory.sources]


class Session:
    """A session on a RolloutClient; a context manager that closes it."""

    def __init__(self, client: Calls, opened: pb.OpenSessionResponse) -> None:
        self.client = client
        self.opened = opened
        self.id = opened.session_id

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(
        self,
        *,
        request_id: str = "",
        required_weight_version: str = "",
        timeout: float | None = None,
        **params: Unpack[Sampling],
    ) -> pb.SessionGenerateResponse:
        """The next model turn; keyword arguments are SamplingParams fields
        (generate_request.Sampling; an unknown name raises TypeError)."""
        request = build_turn_request(self.id, request_id, params, required_weight_version)
        return self.client._unary(self.client.stub.SessionGenerate, request, timeout)

    def generate_stream(
        self,
        *,
        request_id: str = "",
        delta_tokens: int = 0,
        omit_text: bool = False,
        required_weight_version: str = "",
        timeout: float | None = None,
        **params: Unpack[Sampling],
    ) -> Iterator[pb.SessionGenerateStreamResponse]:
        request = build_stream_request(
            self.id, request_id, delta_tokens, omit_text, params, required_weight_version
        )
        with core.rpc_errors():
            yield from self.client.stub.SessionGenerateStream(
                request, **self.client._call_args(timeout)
            )

    def append(
        self,
        token_ids: Sequence[int] | None = None,
        messages: Sequence[Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> pb.AppendToSessionResponse:
        """The environment's output: token ids as they are, or chat messages."""
        request = build_append_request(self.id, token_ids, messages)
        return self.client._unary(self.client.stub.AppendToSession, request, timeout)

    def trajectory(
        self,
        *,
        from_segment: int = 0,
        include_messages: bool = False,
        timeout: float | None = None,
    ) -> pb.GetSessionResponse:
        """The trajectory, or with `from_segment` only its segments from
        there on (GetSessionRequest.from_segment; merge_tail joins them);
        `include_messages`: with the chat messages each segment came from
        (GetSessionResponse.messages)."""
        request = pb.GetSessionRequest(
            session_id=self.id, from_segment=from_segment, include_messages=include_messages
        )
        return self.client._unary(self.client.stub.GetSession, request, timeout)

    def close(self, *, timeout: float | None = None) -> pb.CloseSessionResponse:
        request = pb.CloseSessionRequest(session_id=self.id)
        return self.client._unary(self.client.stub.CloseSession, request, timeout)


class AsyncSession:
    """A session on an AsyncRolloutClient; an async context manager."""

    def __init__(self, client: AsyncCalls, opened: pb.OpenSessionResponse) -> None:
        self.client = client
        self.opened = opened
        self.id = opened.session_id

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def generate(
        self,
        *,
        request_id: str = "",
        required_weight_version: str = "",
        timeout: float | None = None,
        **params: Unpack[Sampling],
    ) -> pb.SessionGenerateResponse:
        request = build_turn_request(self.id, request_id, params, required_weight_version)
        return await self.client._unary(self.client.stub.SessionGenerate, request, timeout)

    async def generate_stream(
        self,
        *,
        request_id: str = "",
        delta_tokens: int = 0,
        omit_text: bool = False,
        required_weight_version: str = "",
        timeout: float | None = None,
        **params: Unpack[Sampling],
    ) -> AsyncIterator[pb.SessionGenerateStreamResponse]:
        request = build_stream_request(
            self.id, request_id, delta_tokens, omit_text, params, required_weight_version
        )
        with core.rpc_errors():
            async for m in self.client.stub.SessionGenerateStream(
                request, **self.client._call_args(timeout)
            ):
                yield m

    async def append(
        self,
        token_ids: Sequence[int] | None = None,
        messages: Sequence[Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> pb.AppendToSessionResponse:
        request = build_append_request(self.id, token_ids, messages)
        return await self.client._unary(self.client.stub.AppendToSession, request, timeout)

    async def trajectory(
        self,
        *,
        from_segment: int = 0,
        include_messages: bool = False,
        timeout: float | None = None,
    ) -> pb.GetSessionResponse:
        request = pb.GetSessionRequest(
            session_id=self.id, from_segment=from_segment, include_messages=include_messages
        )
        return await self.client._unary(self.client.stub.GetSession, request, timeout)

    async def close(self, *, timeout: float | None = None) -> pb.CloseSessionResponse:
        request = pb.CloseSessionRequest(session_id=self.id)
        return await self.client._unary(self.client.stub.CloseSession, request, timeout)
