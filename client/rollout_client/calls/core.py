"""What the sync and the asyncio client share for every call: request
building (the generate requests' in generate_request.py), readiness and error
translation. client.py and async_client.py hold the two surfaces, which differ
only in how a call is made; an update's preparation and retry are the
weights' (weights/updates.py).

A new RPC needs a request builder here (when it takes more than a message),
its name in connection.RETRIED_METHODS if it is safe to send twice, and a
method in each surface."""

from __future__ import annotations

import importlib
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from rollout.v1 import rollout_pb2 as pb
from rollout_client.calls.connection import RolloutError

# Re-exported (`X as X`): the generate requests' builders live in generate_request.py.
from rollout_client.calls.generate_request import (
    build_generate_request as build_generate_request,
)
from rollout_client.calls.generate_request import (
    build_generate_stream_request as build_generate_stream_request,
)
from rollout_client.calls.generate_request import chat_messages as chat_messages
from rollout_client.calls.generate_request import sampling_params as sampling_params


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


# An update's preparation and retry moved to weights/updates.py (this module,
# the ground every call stands on, imports nothing of the weights): their old
# names here warn and give the moved function until 0.3. By name, not by an
# import, so that no arrow points from the calls up to the weights.
_MOVED = {"prepare_update", "send_update", "retry_delay", "adapter_target", "adapter_removal"}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"{__name__}.{name} moved to rollout_client.weights.updates; the old path goes in 0.3",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module("rollout_client.weights.updates"), name)
