"""Metrics of the HTTP front, in the registry --metrics-port serves (beside
the gRPC ones in ops/metrics.py): requests by route and status, and their
time to the response's end (a stream's last event)."""

from __future__ import annotations

import re

from prometheus_client import REGISTRY, Counter, Histogram

REQUESTS = Counter(
    "rollout_http_requests",
    "Requests to the OpenAI-compatible HTTP API, by route and HTTP status.",
    ("route", "status"),
    registry=REGISTRY,
)
DURATION = Histogram(
    "rollout_http_request_duration_seconds",
    "Time from an HTTP request's arrival to the end of its response.",
    ("route",),
    registry=REGISTRY,
)
# Routes by path: anything else counts as "other" (paths are unbounded).
ROUTES = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/sessions"}
)
# A session's routes, counted under their template (one label for every id).
SESSION_ROUTE = re.compile(r"/sessions/[^/]+/v1/(chat/completions|models)")


def route_label(path: str) -> str:
    if path in ROUTES:
        return path
    session = SESSION_ROUTE.fullmatch(path)
    return f"/sessions/{{id}}/v1/{session.group(1)}" if session else "other"
