"""Synchronous and asyncio clients with the same surface.

Results are the rollout.v1 proto messages (documented in
proto/rollout/v1/rollout.proto). Failures raise `RolloutError`, which carries
the gRPC status code and the server's message.

    >>> client = RolloutClient("127.0.0.1:50051")            # doctest: +SKIP
    >>> client.wait_until_ready(timeout=120)                  # doctest: +SKIP
    >>> r = client.generate(prompt_text="Hello", max_tokens=8, temperature=0)  # doctest: +SKIP
    >>> r.completions[0].token_ids, r.weight_version          # doctest: +SKIP
    >>> client.update_weights(model.state_dict(), version="step-1")  # doctest: +SKIP

The two classes (AsyncRolloutClient in async_client.py) share everything but
the call itself: what they hold from surface.py; requests, readiness and
errors from calls/core.py; update preparation from weights/updates.py; channels
and the retry policy (gRPC's own, from the service config) from
calls/connection.py.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

import grpc

from rollout.v1 import rollout_pb2 as pb
from rollout_client import sessions

# Re-exported (`X as X`: the explicit form, for type checkers too); the
# asyncio client lives in async_client.py.
from rollout_client.async_client import AsyncRolloutClient as AsyncRolloutClient
from rollout_client.calls import core
from rollout_client.calls.connection import (
    DEFAULT_MAX_MESSAGE_BYTES as DEFAULT_MAX_MESSAGE_BYTES,
)
from rollout_client.calls.connection import ConnectionOptions as ConnectionOptions
from rollout_client.calls.connection import RolloutError as RolloutError
from rollout_client.calls.generate_request import (
    GenerateOptions,
    StreamOptions,
    build_generate_stream_request,
)
from rollout_client.calls.generate_request import build_generate_request as build_generate_request
from rollout_client.surface import Surface
from rollout_client.weights import interrupts, push, update_options, updates
from rollout_client.weights.update_options import UpdateOptions

if TYPE_CHECKING:  # numpy: imported by delta pushes only
    from rollout_client.weights.delta_push import PushedWeights

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


class RolloutClient(Surface[grpc.Channel]):
    """Blocking client. Every call takes `timeout` (seconds, the deadline)."""

    _regions: push.Regions | None = None  # same-host updates' mappings, kept
    # What update_weights(delta=True) pushed last (made on first use; set
    # one with max_bytes to bound its memory).
    pushed: PushedWeights | None = None

    def close(self) -> None:
        self.channel.close()
        if self._regions is not None:
            self._regions.close()

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _channel(self, own_connection: bool = False) -> grpc.Channel:
        return self.options.channel(self.target, aio=False, own_connection=own_connection)

    def _unary(
        self,
        method: grpc.UnaryUnaryMultiCallable[_Req, _Resp],
        request: _Req,
        timeout: float | None,
    ) -> _Resp:
        with core.rpc_errors():
            return method(request, **self._call_args(timeout))

    def _health_status(self) -> int | RolloutError:
        try:
            response = self._health.Check(core.HEALTH_CHECK, **self._call_args(core.HEALTH_TIMEOUT))
        except grpc.RpcError as e:
            return RolloutError.wrap(e)
        status: int = response.status
        return status

    def wait_until_ready(
        self, timeout: float = 300.0, *, connect_grace: float | None = core.CONNECT_GRACE
    ) -> None:
        """Polls health until SERVING. Raises rollout_client.ServerNotReady
        (a TimeoutError, with the last check's failure) after `timeout`
        seconds, or sooner when no check has reached a server for
        `connect_grace` seconds (a wrong address: connection refused; None:
        wait the whole timeout). A server that answers NOT_SERVING (its
        engine warming up) is waited for until the timeout."""
        ready = core.Readiness(self.target, timeout, connect_grace)
        while not ready.done(self._health_status()):
            time.sleep(core.POLL_SECONDS)

    def server_info(self, timeout: float | None = None) -> pb.GetServerInfoResponse:
        return self._unary(self.stub.GetServerInfo, pb.GetServerInfoRequest(), timeout)

    def generate(
        self, *, timeout: float | None = None, **options: Unpack[GenerateOptions]
    ) -> pb.GenerateResponse:
        """One prompt's completions. The options (GenerateOptions, typed in
        generate_request.py; an unknown name raises TypeError):

        - the prompt, exactly one of `prompt_text`, `prompt_token_ids` and
          chat `messages` (dicts such as {"role": "user", "content": "Hi"},
          with `continue_final_message` to continue the last one); `images`
          for a multimodal model's placeholders;
        - `request_id` (for logs and abort()), `lora_adapter` (a loaded
          adapter's name), `required_weight_version`: with "step-7" the call
          runs only on that version (RolloutError with reason
          WRONG_WEIGHT_VERSION otherwise, before any token), so a rollout
          cannot come from other weights;
        - SamplingParams' fields, as the proto names them (None: unset):
          `max_tokens`, `temperature`, `top_p`, `top_k`, `min_p`, `seed`, `n`,
          `logprobs`, `stop`, `stop_token_ids`, `ignore_eos`,
          `repetition_penalty`, `presence_penalty`, `frequency_penalty`,
          `min_tokens`, `prompt_logprobs`, `structured_output`
          (pb.StructuredOutput(regex=...)), `allowed_token_ids`.

        `timeout`: the call's deadline in seconds (the client's by default)."""
        request = build_generate_request(**options)
        return self._unary(self.stub.Generate, request, timeout)

    def generate_stream(
        self, *, timeout: float | None = None, **options: Unpack[StreamOptions]
    ) -> Iterator[pb.GenerateStreamResponse]:
        """generate's completions as they are made: generate's options and
        `delta_tokens` (tokens per delta; the first and the last come at
        once), `omit_text` (token ids only). A wrong option raises here, not
        at the first delta."""
        request = build_generate_stream_request(**options)
        return self._stream(request, timeout)

    def _stream(
        self, request: pb.GenerateStreamRequest, timeout: float | None
    ) -> Iterator[pb.GenerateStreamResponse]:
        with core.rpc_errors():
            yield from self.stub.GenerateStream(request, **self._call_args(timeout))

    def generate_many(
        self, requests: Iterable[pb.GenerateStreamRequest], *, timeout: float | None = None
    ) -> Iterator[pb.GenerateManyResponse]:
        """Every request on one GenerateMany stream (each with its own
        request_id), sent as the iterable yields them; the responses carry
        the deltas of all of them, each labelled with its request_id."""
        messages = (pb.GenerateManyRequest(request=r) for r in requests)
        with core.rpc_errors():
            yield from self.stub.GenerateMany(messages, **self._call_args(timeout))

    def reset_caches(self, timeout: float | None = None) -> pb.ResetCachesResponse:
        return self._unary(self.stub.ResetCaches, pb.ResetCachesRequest(), timeout)

    def update_weights(
        self,
        source: Any,
        version: str,
        *,
        _state: interrupts.PushState | None = None,  # AsyncRolloutClient's handle on the push
        **options: Unpack[UpdateOptions],
    ) -> pb.UpdateWeightsResponse:
        """Sends `source` (a safetensors file or folder, a state_dict, a
        module or an iterable of (name, tensor)), read tensor by tensor,
        after checking it against the manifest. `streams` > 1 uploads over
        that many connections at once; `same_host` writes the bytes straight
        into the server's staging region (same host, /dev/shm and user).
        `drain_timeout_seconds` bounds the wait for in-flight calls (WAIT
        mode; see UpdateWeightsBegin). Retried like the other calls: a retry
        of an applied update returns its acknowledgement.

        With `adapter` (a name) and `adapter_config` (PEFT's
        adapter_config.json as a dict), `source` is a LoRA adapter's tensors
        (PEFT names) and the update loads or replaces that adapter; the base
        weights are untouched, `version` is the adapter's.

        With `delta=True`, the client keeps a copy of what it pushes
        (`self.pushed`, a delta_push.PushedWeights: the model's size in host
        memory, or less with its max_bytes) and, when the server's delta
        base is the version it pushed last, sends the cheaper of a delta
        (only what changed) and a full update, from what its earlier pushes
        measured (delta_costs.py; `self.pushed.costs.history` says which way
        each push went and why; docs/weight-sync.md#delta-updates); a full
        update when the server refuses the base. `delta="always"`: a delta
        whenever the server's base allows it (for measuring).

        Ctrl-C raises rollout_client.UpdateInterrupted (a KeyboardInterrupt): it
        says whether the commit had been sent, so whether the update may
        have been applied, and how to check.

        The options (update_options.UpdateOptions, typed there with their
        defaults; an unknown name raises TypeError): `pause_mode`,
        `chunk_bytes`, `checksum`, `progress`, `timeout`,
        `drain_timeout_seconds`, `streams`, `same_host`, `adapter`,
        `adapter_config`, `delta`."""
        update_options.check(options)
        state = _state or interrupts.PushState()
        with interrupts.reported(state, version):
            target = updates.adapter_target(options.get("adapter"), options.get("adapter_config"))
            if options.get("delta"):
                if target is not None:
                    raise ValueError("delta=True applies to the base weights, not to an adapter")
                return self._update_delta(source, version, options, state)
            info = None if target else self.server_info(options.get("timeout"))
            u = self._preparing(source, version, info, options, target, state)()
            return self._send(u, options.get("streams", 1), options.get("same_host", False))

    def _update_delta(
        self, source: Any, version: str, options: UpdateOptions, state: interrupts.PushState
    ) -> pb.UpdateWeightsResponse:
        """update_weights(delta=...): the cheaper of a delta against
        `self.pushed` (when the server's base is its version) and a full
        update (delta_push.push_cheaper); either is recorded once acknowledged."""
        from rollout_client.weights import delta_push

        if self.pushed is None:
            self.pushed = delta_push.PushedWeights()
        pushed = self.pushed
        info = self.server_info(options.get("timeout"))
        u = self._preparing(source, version, info, options, None, state)()
        streams, same_host = options.get("streams", 1), options.get("same_host", False)
        always = options.get("delta") == "always"
        has_base = bool(pushed.version) and pushed.version == info.delta_base_version

        def send(update: push.Update) -> pb.UpdateWeightsResponse:
            return self._send(update, streams, same_host)

        transport = (streams, same_host)
        return delta_push.push_cheaper(pushed, u, has_base, transport, send, always)

    def _send(self, u: push.Update, streams: int, same_host: bool) -> pb.UpdateWeightsResponse:
        if self._regions is None:
            self._regions = push.Regions()
        regions = self._regions
        new_channel = functools.partial(self._channel, own_connection=True)

        def send() -> pb.UpdateWeightsResponse:
            return push.send(u, self.channel, new_channel, streams, same_host, regions)

        return updates.send_update(u, self.options, send)

    def remove_adapter(
        self, name: str, version: str, *, timeout: float | None = None
    ) -> pb.UpdateWeightsResponse:
        """Unloads LoRA adapter `name` (an update with no tensors)."""
        with core.rpc_errors():
            return self.stub.UpdateWeights(
                iter(updates.adapter_removal(name, version)), **self._call_args(timeout)
            )

    def abort(
        self, request_ids: Iterable[str] = (), *, all: bool = False, timeout: float | None = None
    ) -> pb.AbortResponse:
        """Ends running Generate calls by request id (or all); they return
        their partial tokens with FINISH_REASON_ABORT."""
        return self._unary(self.stub.Abort, core.build_abort_request(request_ids, all), timeout)

    def tokenize(self, *, timeout: float | None = None, **kwargs: Any) -> pb.TokenizeResponse:
        """`text=` or chat `messages=` (see core.chat_messages) to token ids."""
        return self._unary(self.stub.Tokenize, core.build_tokenize_request(**kwargs), timeout)

    def detokenize(
        self,
        token_ids: Iterable[int],
        *,
        skip_special_tokens: bool = False,
        timeout: float | None = None,
    ) -> pb.DetokenizeResponse:
        request = pb.DetokenizeRequest(
            token_ids=list(token_ids), skip_special_tokens=skip_special_tokens
        )
        return self._unary(self.stub.Detokenize, request, timeout)

    def sleep(self, level: int = 1, *, timeout: float | None = None) -> pb.SleepResponse:
        """Frees the accelerator (vLLM's sleep mode, GPU hosts); WakeUp resumes."""
        return self._unary(self.stub.Sleep, pb.SleepRequest(level=level), timeout)

    def open_session(self, *, timeout: float | None = None, **kwargs: Any) -> sessions.Session:
        """A session (sessions.build_open_request's arguments): one trajectory
        the server holds token for token; a context manager that closes it."""
        request = sessions.build_open_request(**kwargs)
        return sessions.Session(self, self._unary(self.stub.OpenSession, request, timeout))

    def session(self, session_id: str) -> sessions.Session:
        """A handle on an open session by its id (one opened elsewhere, or by
        a Fleet); no call is made."""
        return sessions.Session(self, pb.OpenSessionResponse(session_id=session_id))

    def wake_up(self, *, timeout: float | None = None) -> pb.WakeUpResponse:
        return self._unary(self.stub.WakeUp, pb.WakeUpRequest(), timeout)
