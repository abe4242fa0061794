"""The gRPC front's tracing: a SERVER span for every RPC, whose trace context
tracing.py hands to vLLM (its `llm_request` span becomes a child of it).

On with vLLM's own `--otlp-traces-endpoint` (it passes through `serve`);
without it nothing here runs: no interceptor, no headers per request.
The exporter is vLLM's (`vllm.tracing.init_tracer`: OTLP over gRPC, or
HTTP with OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf), so the
server's spans and the engine's go the same way.

Our own interceptor rather than opentelemetry-instrumentation-grpc's aio
one: that one records a cancelled or timed-out call as status 0 (OK), which
MetricsInterceptor counts as CANCELLED, and adds two exception events with
tracebacks to every call the error policy aborts on purpose. It honours the
contrib one's OTEL_PYTHON_GRPC_EXCLUDED_SERVICES (comma-separated services,
e.g. `grpc.health.v1.Health` for the probes of an orchestrator).
"""

from __future__ import annotations

import logging
import os
from contextvars import Token

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from rollout_service.ops import tracing
from rollout_service.ops.grpc_metrics import call_code
from rollout_service.ops.shapes import around

log = logging.getLogger(__name__)

# Server-side codes that are errors, as OpenTelemetry's RPC conventions say
# (a caller's bad argument is not the server's failure).
_SERVER_ERRORS = {
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DATA_LOSS,
}


class _RefusedOverride(logging.Filter):
    """AsyncLLM builds a second tracer provider from the same endpoint; the
    global one stays ours (it serves vLLM's spans in this process too), so
    OpenTelemetry's warning about the refused override says nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Overriding of current TracerProvider" not in record.getMessage()


def setup(endpoint: str | None) -> TracingInterceptor | None:
    """Exports spans to `endpoint` and returns the interceptor that makes
    them; None (and nothing set up) without an endpoint."""
    if endpoint is None:
        return None
    from vllm.tracing import init_tracer

    # Resource.create reads it, here and in vLLM's engine processes.
    os.environ.setdefault("OTEL_SERVICE_NAME", "rollout-service")
    tracer = init_tracer("rollout_service", endpoint)
    logging.getLogger("opentelemetry.trace").addFilter(_RefusedOverride())
    tracing.enable()
    raw = os.environ.get("OTEL_PYTHON_GRPC_EXCLUDED_SERVICES", "")
    excluded = frozenset(s.strip() for s in raw.split(",") if s.strip())
    log.info(
        "tracing: OTLP spans to %s%s",
        endpoint,
        f" (not for {', '.join(sorted(excluded))})" if excluded else "",
    )
    return TracingInterceptor(tracer, excluded)


class TracingInterceptor(grpc.aio.ServerInterceptor):
    """A SERVER span per RPC, named `package.Service/Method`, child of the
    caller's `traceparent` metadata when it sends one, current while the
    handler runs; none for the services in `excluded`."""

    def __init__(self, tracer: trace.Tracer, excluded: frozenset[str] = frozenset()) -> None:
        self.tracer = tracer
        self.excluded = excluded

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        name = details.method.lstrip("/")
        service, _, method = name.partition("/")
        if service in self.excluded:
            return handler
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
        metadata = dict(details.invocation_metadata or ())
        return around(
            handler,
            lambda: self._start(name, attributes, metadata),
            lambda started, context, cancelled: _end(*started, context, cancelled),
        )

    def _start(
        self, name: str, attributes: dict, metadata: dict
    ) -> tuple[trace.Span, Token[otel_context.Context]]:
        parent = tracing.PROPAGATOR.extract(metadata)
        span = self.tracer.start_span(
            name, context=parent, kind=SpanKind.SERVER, attributes=attributes
        )
        return span, otel_context.attach(trace.set_span_in_context(span, parent))


def _end(span: trace.Span, token: Token[otel_context.Context], context, cancelled: bool) -> None:
    otel_context.detach(token)
    code = call_code(context, cancelled)
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code in _SERVER_ERRORS:
        span.set_status(Status(StatusCode.ERROR, f"{code.name}: {context.details() or ''}"))
    span.end()
