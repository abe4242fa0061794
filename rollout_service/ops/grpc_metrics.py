"""The gRPC front's metrics interceptor: every RPC started, handled by code
and reason, and its handling time, into the metrics of metrics.py."""

from __future__ import annotations

import time

import grpc

from rollout_service.ops.metrics import HANDLED, HANDLING, REFUSALS, STARTED
from rollout_service.ops.shapes import around

_TYPES = {
    (False, False): "unary",
    (False, True): "server_stream",
    (True, False): "client_stream",
    (True, True): "bidi_stream",
}


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts every RPC: started, handled by code, handling time."""

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        _, service, method = details.method.split("/")
        labels = (_TYPES[(handler.request_streaming, handler.response_streaming)], service, method)
        return around(
            handler,
            lambda: _start(labels),
            lambda t0, context, cancelled: _finish(labels, context, t0, cancelled),
        )


def _start(labels) -> float:
    STARTED.labels(*labels).inc()
    return time.perf_counter()


def call_code(context, cancelled: bool) -> grpc.StatusCode:
    """The status a call ended with (read once its handler is done)."""
    code = grpc.StatusCode.CANCELLED if cancelled else context.code()
    if code is None:
        return grpc.StatusCode.OK
    if isinstance(code, int):
        return next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)
    return code


def refusal_reason(context) -> str:
    """The ErrorInfo reason in the trailers a call ended with ('' without one)."""
    from google.rpc import error_details_pb2, status_pb2

    for key, value in context.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            info = error_details_pb2.ErrorInfo()
            for detail in status_pb2.Status.FromString(value).details:
                if detail.Unpack(info):
                    return info.reason
    return ""


def _finish(labels, context, t0: float, cancelled: bool) -> None:
    code = call_code(context, cancelled)
    HANDLED.labels(*labels, code.name).inc()
    HANDLING.labels(*labels).observe(time.perf_counter() - t0)
    if code is not grpc.StatusCode.OK and (reason := refusal_reason(context)):
        REFUSALS.labels(labels[2], code.name, reason).inc()
