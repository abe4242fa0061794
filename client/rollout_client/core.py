"""What the sync and the asyncio client share: request building (the generate
requests' in generate_request.py), readiness, error translation, update
preparation and the retry of a whole update. client.py holds the two
surfaces, which differ only in how a call is made.

A new RPC needs a request builder here (when it takes more than a message),
its name in connection.RETRIED_METHODS if it is safe to send twice, and a
method in each surface."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from rollout.v1 import rollout_pb2 as pb
from rollout_client import push, update_options
from rollout_client.connection import ConnectionOptions, Metadata, RolloutError

# Re-exported (`X as X`): the generate requests' builders live in generate_request.py.
from rollout_client.generate_request import (
    build_generate_request as build_generate_request,
)
from rollout_client.generate_request import (
    build_generate_stream_request as build_generate_stream_request,
)
from rollout_client.generate_request import chat_messages as chat_messages
from rollout_client.generate_request import sampling_params as sampling_params
from rollout_client.interrupts import PushState
from rollout_client.update_options import UpdateOptions
from rollout_codecs import extras


def build_tokenize_request(
    text: str | None = None,
    messages: Sequence[Any] | None = None,
    continue_final_message: bool = False,
    add_special_tokens: bool = False,
) -> pb.TokenizeRequest:
    request = pb.TokenizeRequest(
        text=text or "",
        messages=chat_messages(messages or []),
        add_special_tokens=add_special_tokens,
    )
    if continue_final_message:
        request.chat_options.continue_final_message = True
    return request


def build_abort_request(request_ids: Iterable[str] = (), all: bool = False) -> pb.AbortRequest:
    return pb.AbortRequest(request_ids=list(request_ids), all=all)


def adapter_target(name: str | None, config: dict[str, Any] | None) -> pb.AdapterTarget | None:
    """The AdapterTarget of a LoRA load (None: a base update)."""
    if name is None:
        if config is not None:
            raise TypeError("adapter_config needs adapter (the adapter's name)")
        return None
    if config is None:
        raise TypeError("adapter needs adapter_config (PEFT's adapter_config.json as a dict)")
    return pb.AdapterTarget(
        name=name, action=pb.ADAPTER_ACTION_LOAD, config_json=json.dumps(config)
    )


def adapter_removal(name: str, version: str) -> list[pb.UpdateWeightsRequest]:
    """The UpdateWeights stream that unloads LoRA adapter `name`."""
    target = pb.AdapterTarget(name=name, action=pb.ADAPTER_ACTION_REMOVE)
    begin = pb.UpdateWeightsBegin(weight_version=version, adapter=target)
    return [
        pb.UpdateWeightsRequest(begin=begin),
        pb.UpdateWeightsRequest(commit=pb.UpdateWeightsCommit()),
    ]


@contextmanager
def rpc_errors() -> Iterator[None]:
    """gRPC's errors raised inside, as RolloutError (sync and async code alike)."""
    try:
        yield
    except grpc.RpcError as e:
        raise RolloutError.wrap(e) from None


HEALTH_CHECK = health_pb2.HealthCheckRequest()
SERVING: int = health_pb2.HealthCheckResponse.SERVING
HEALTH_TIMEOUT = 5.0  # seconds, one health check
POLL_SECONDS = 0.5  # between health checks
# How long the readiness wait goes on while no health check reaches a server
# (each fails UNAVAILABLE: connection refused, no such host, a TLS mismatch).
# Not at once: a server just started needs a few seconds to listen (imports;
# `rollout-service serve` listened after 5.3 s on a loaded 2-core machine).
# Past that it is a wrong address or a server that died, and waiting out the
# whole timeout in silence would hide it. An engine warming up for minutes
# answers NOT_SERVING meanwhile, and is waited for until the timeout.
CONNECT_GRACE = 15.0


class ServerNotReady(TimeoutError):
    """wait_until_ready gave up (a TimeoutError, as it always was).
    `last_error`: the last health check's failure (a RolloutError: code and
    details), None if the server answered it; `status`: the health status
    the server answered last (None if no check ever reached it)."""

    def __init__(self, text: str, last_error: RolloutError | None, status: int | None) -> None:
        super().__init__(text)
        self.last_error = last_error
        self.status = status


class Readiness:
    """The readiness wait: health checks until SERVING; ServerNotReady after
    `timeout` seconds, or after `connect_grace` seconds in which no check
    reached a server (None: the whole timeout). The surfaces make the checks
    and the pauses."""

    def __init__(self, target: str, timeout: float, connect_grace: float | None) -> None:
        if connect_grace is not None and connect_grace < 0:
            raise ValueError(f"connect_grace: seconds >= 0 or None, got {connect_grace}")
        self.target = target
        self.timeout = timeout
        self.connect_grace = connect_grace
        self.reached = time.monotonic()  # the last check that reached a server (or the start)
        self.deadline = self.reached + timeout
        self.status: int | None = None
        self.error: RolloutError | None = None

    def done(self, answer: int | RolloutError) -> bool:
        """True once `answer` (a health status, or the check's failure) is
        SERVING; raises ServerNotReady once the wait is over."""
        now = time.monotonic()
        if isinstance(answer, RolloutError):
            self.error = answer
            if answer.code != grpc.StatusCode.UNAVAILABLE:
                self.reached = now
        elif answer == SERVING:
            return True
        else:
            self.status, self.error, self.reached = answer, None, now
        grace = self.connect_grace
        if self.error is not None and grace is not None and now - self.reached >= grace:
            raise ServerNotReady(
                f"no server reachable at {self.target} for {grace:g}s: {self.error}. Is the "
                "server running, on this host and port (`rollout-service serve` listens on "
                "127.0.0.1:50051 unless --host or --port say otherwise), and TLS on both sides "
                "or neither? One that takes longer to start listening needs a larger "
                "connect_grace (None: wait the whole timeout)",
                self.error,
                self.status,
            )
        if now > self.deadline:
            raise ServerNotReady(self._timed_out(), self.error, self.status)
        return False

    def _timed_out(self) -> str:
        text = f"server at {self.target} not SERVING after {self.timeout:g}s"
        if self.error is not None:
            return f"{text}: the last health check failed: {self.error}"
        if self.status is None:
            return f"{text}: no health check was answered"
        name = health_pb2.HealthCheckResponse.ServingStatus.Name(self.status)
        return (
            f"{text}: it answers {name} (its engine is still starting or warming up, "
            "which takes minutes on a CPU; or it is degraded after a failed update: "
            "server_info().degraded); a larger timeout waits longer"
        )


def prepare_update(
    source: Any,
    version: str,
    info: pb.GetServerInfoResponse | None,
    options: UpdateOptions,
    *,
    adapter: pb.AdapterTarget | None,
    timeout: float | None,
    metadata: Metadata,
    state: PushState,
) -> push.Update:
    """The update of `source` with update_weights' `options`, checked
    against the manifest of the server's `info` (None: an adapter's, which
    the server checks) and batched when it takes batches, with its progress
    bar (none for a delta push), deadline, metadata and the state it shares
    with whoever may interrupt it (interrupts.py). Both clients' update
    starts here."""
    manifest = None if info is None else info.parameters
    begin = update_options.begin(options)
    u = push.prepare(source, version, manifest, adapter=adapter, **begin)
    u.batch_chunks = info is not None and info.accepts_chunk_batches
    progress = options.get("progress", False) and not options.get("delta")
    u.progress = _progress_bar(sum(t.nbytes for t in u.tensors), progress)
    u.timeout = timeout
    u.metadata = metadata
    u.state = state
    return u


def _progress_bar(total: int, enabled: bool) -> push.Progress | None:
    if not enabled:
        return None
    tqdm = extras.require("tqdm", "progress=True").tqdm
    bar: push.Progress = tqdm(total=total, unit="B", unit_scale=True, desc="UpdateWeights")
    return bar


def send_update(
    u: push.Update, options: ConnectionOptions, send: Callable[[], pb.UpdateWeightsResponse]
) -> pb.UpdateWeightsResponse:
    """`send()`, again after UNAVAILABLE as often as `options` says, with the
    same backoff as the unary calls' policy.

    gRPC's retry policy cannot do this for a client stream (it would have to
    hold the whole stream to replay it), and a retry of one call of a staged
    update would find the update half done. A whole update is safe to send
    again: a retry begins afresh with the same version and bytes; one the
    server has applied already is answered with the original acknowledgement
    (`replayed`) without touching the engine, one it has not is received anew."""
    delays = iter(options.delays())
    try:
        while True:
            u.state.check()  # stopped while waiting to retry: no new attempt
            try:
                return send()
            except grpc.RpcError as e:
                time.sleep(retry_delay(e, delays))
    finally:
        if u.progress is not None:
            u.progress.close()


def retry_delay(e: grpc.RpcError, delays: Iterator[float]) -> float:
    """How long to wait before sending a whole update again after `e`
    (UNAVAILABLE, while retries are left); raises `e` as a RolloutError
    otherwise. Both clients' retry loops ask this."""
    delay = next(delays, None)
    if e.code() != grpc.StatusCode.UNAVAILABLE or delay is None:
        raise RolloutError.wrap(e) from None
    return delay
