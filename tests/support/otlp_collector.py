"""An OTLP/gRPC trace collector run in the test process: what a server
started with vLLM's --otlp-traces-endpoint exports its spans to
(tests/engine/serving/test_observability.py)."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver that keeps every span with its resource's
    service name."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[tuple[str, trace_pb2.Span]] = []

    def Export(self, request, context):
        with self.lock:
            for rs in request.resource_spans:
                attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    self.spans.extend((attrs.get("service.name", ""), s) for s in ss.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait(self, trace_id: bytes, names: set[str], timeout: float = 60):
        """The spans of a trace, once one of each name has arrived."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                found = [(svc, s) for svc, s in self.spans if s.trace_id == trace_id]
            if names <= {s.name for _, s in found}:
                return found
            assert time.monotonic() < deadline, f"spans of {trace_id.hex()}: {found}"
            time.sleep(0.2)

    def named(self, name: str) -> list[trace_pb2.Span]:
        with self.lock:
            return [s for _, s in self.spans if s.name == name]


def start_collector() -> tuple[Collector, grpc.Server, int]:
    """A collector listening on a free local port: it, its server, the port."""
    collector = Collector()
    receiver = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, receiver)
    port = receiver.add_insecure_port("127.0.0.1:0")
    receiver.start()
    return collector, receiver, port
