"""OpenTelemetry tracing: the trace context of the running call handed to
vLLM, whose `llm_request` span then becomes a child of the front's span
(grpc_tracing.py makes the gRPC front's SERVER spans and turns this on).

Off unless vLLM's own `--otlp-traces-endpoint` is given: no headers per
request then.
"""

from __future__ import annotations

from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

# vLLM reads the trace context of an engine request with this propagator.
PROPAGATOR = TraceContextTextMapPropagator()
_enabled = False


def enable() -> None:
    """From now on `headers` hands the current span's context to vLLM."""
    global _enabled
    _enabled = True


def headers() -> dict[str, str] | None:
    """The current span's W3C trace context, for AsyncLLM.generate's
    `trace_headers`; None when tracing is off."""
    if not _enabled:
        return None
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier)
    return carrier or None
