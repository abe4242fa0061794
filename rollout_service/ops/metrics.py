"""Prometheus metrics: per-RPC counters with the usual gRPC names (counted
by the gRPC front's interceptor, grpc_metrics.py), and the service's own
(TTFT, tokens, queue, pause, weight version, updates, resets).

Served over HTTP (`--metrics-port`) by prometheus_client from its default
registry, where vLLM's PrometheusStatLogger (built by AsyncLLM in this process
unless `--disable-log-stats`) keeps the engine's `vllm:` metrics: one
endpoint shows both. One registry also means a name both claimed would fail
at registration instead of appearing twice.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, Info

_LABELS = ("grpc_type", "grpc_service", "grpc_method")
STARTED = Counter("grpc_server_started", "RPCs started on the server.", _LABELS, registry=REGISTRY)
HANDLED = Counter(
    "grpc_server_handled",
    "RPCs completed on the server, by status code.",
    (*_LABELS, "grpc_code"),
    registry=REGISTRY,
)
HANDLING = Histogram(
    "grpc_server_handling_seconds",
    "Time from the start of an RPC to its status.",
    _LABELS,
    registry=REGISTRY,
)
TTFT = Histogram(
    "rollout_generate_time_to_first_token_seconds",
    "Time from a Generate call's admission to its first token.",
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
TOKENS = Counter(
    "rollout_generate_tokens", "Tokens processed by Generate.", ("kind",), registry=REGISTRY
)
# The children, looked up once (labels() costs a lock and a dict per call).
PROMPT_TOKENS = TOKENS.labels("prompt")
COMPLETION_TOKENS = TOKENS.labels("completion")
ENGINE_REQUESTS = Counter(
    "rollout_engine_requests",
    "Engine requests the pipeline made: one per generation that reached the engine, "
    "aborted ones included (vLLM's vllm:request_success_total counts no aborted request).",
    registry=REGISTRY,
)
QUEUED = Gauge(
    "rollout_generate_waiting", "Generate calls waiting at the closed gate.", registry=REGISTRY
)
RUNNING = Gauge("rollout_generate_running", "Generate calls admitted.", registry=REGISTRY)
PAUSED = Gauge(
    "rollout_paused", "1 while an update or cache reset holds the gate.", registry=REGISTRY
)
# Per caller (fairness/identity.py's labels: a role and a token digest, a
# tenant, or "connection" for every caller without either).
CALLER_IN_FLIGHT = Gauge(
    "rollout_caller_requests_in_flight",
    "Generations a caller has in flight (waiting, queued in the engine or running).",
    ("caller",),
    registry=REGISTRY,
)
CALLER_IN_ENGINE = Gauge(
    "rollout_caller_requests_in_engine",
    "Of a caller's generations in flight, those holding an engine seat (queued in the engine "
    "or running); the others wait for one in the server.",
    ("caller",),
    registry=REGISTRY,
)
CALLER_TOKENS = Counter(
    "rollout_caller_tokens",
    "Tokens a caller's generations processed.",
    ("caller", "kind"),
    registry=REGISTRY,
)
WEIGHT_VERSION = Info("rollout_weight", "The served weight version.", registry=REGISTRY)
UPDATE_BYTES = Counter(
    "rollout_update_bytes", "Tensor bytes received by UpdateWeights.", registry=REGISTRY
)
UPDATE_SECONDS = Histogram(
    "rollout_update_duration_seconds",
    "UpdateWeights phases.",
    ("phase",),
    registry=REGISTRY,
)
KEEP_HELD = Counter(
    "rollout_keep_held",
    "PAUSE_MODE_KEEP updates whose engine pause came over 0.5 s after their commit "
    "(update/timings.py), by the phase that took the time: check, wait, drain or pause.",
    ("phase",),
    registry=REGISTRY,
)
# Every phase exported from the start, at 0: a healthy run shows no hold
# (the dashboard's panel, deploy/grafana), not "no data".
for _phase in ("check", "wait", "drain", "pause"):
    KEEP_HELD.labels(_phase)
UPDATES = Counter(
    "rollout_updates",
    "UpdateWeights calls by outcome (status code).",
    ("outcome",),
    registry=REGISTRY,
)
CACHE_RESETS = Counter(
    "rollout_cache_resets", "Cache resets by cache.", ("cache",), registry=REGISTRY
)
# Sessions (sessions/store.py), read at each scrape.
SESSIONS_OPEN = Gauge("rollout_sessions_open", "Sessions open.", registry=REGISTRY)
SESSION_HISTORY_BYTES = Gauge(
    "rollout_session_history_bytes",
    "Bytes the open sessions' histories hold (token ids, sources and logprobs, segments, "
    "appended messages' text; trajectory.py's sizes).",
    registry=REGISTRY,
)
SESSION_RESERVED_TOKENS = Gauge(
    "rollout_session_reserved_tokens",
    "Tokens the open sessions reserve: their whole budgets, at most --max-session-tokens.",
    registry=REGISTRY,
)
REFUSALS = Counter(
    "rollout_refusals",
    "Calls that ended with an ErrorInfo reason (rollout.v1.ErrorReason without its prefix), "
    "by method, status code and reason: every status of the error policy and of auth.",
    ("grpc_method", "grpc_code", "reason"),
    registry=REGISTRY,
)


def bind(gate, updater) -> None:
    """Gauges read live from the gate and the updater."""
    QUEUED.set_function(lambda: gate.waiting)
    RUNNING.set_function(lambda: gate.admitted)
    PAUSED.set_function(lambda: 0 if gate.is_open else 1)
    WEIGHT_VERSION.info({"version": gate.served.version})


def bind_sessions(store) -> None:
    """Gauges read live from the session store (on the metrics thread: the
    store's `held` reads without sweeping)."""
    SESSIONS_OPEN.set_function(lambda: store.held()[0])
    SESSION_HISTORY_BYTES.set_function(lambda: store.held()[1])
    SESSION_RESERVED_TOKENS.set_function(lambda: store.reserved)


def start_http(port: int, host: str = "127.0.0.1") -> int:
    """Serves /metrics; returns the port."""
    from prometheus_client import start_http_server

    server, _ = start_http_server(port, addr=host, registry=REGISTRY)
    return server.server_port
