"""Tracing and engine metrics: one real server started with vLLM's
--otlp-traces-endpoint (pointing at an OTLP/gRPC collector run here) and
--metrics-port; and the tracing interceptor alone on a tiny grpc.aio server."""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request

import grpc
import pytest
from opentelemetry.proto.trace.v1 import trace_pb2

from rollout_client import RolloutClient, pb
from rollout_service.ops import grpc_tracing, tracing

GENERATE = "rollout.v1.RolloutService/Generate"


def _attrs(span) -> dict:
    out = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = v.int_value if v.HasField("int_value") else v.string_value
    return out


@pytest.fixture(scope="module")
def observed(traced_server):
    """conftest's traced_server: its collector, a client, its metrics port."""
    with RolloutClient(traced_server.target, timeout=120) as client:
        yield traced_server.collector, client, traced_server.metrics_port


def _request(request_id: str) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=request_id,
        prompt_text="hello",
        sampling_params=pb.SamplingParams(max_tokens=4, temperature=0),
    )


def test_generate_span_continues_the_callers_trace_and_parents_vllms(observed):
    collector, client, _ = observed
    trace_id, caller_span = os.urandom(16), os.urandom(8)
    traceparent = f"00-{trace_id.hex()}-{caller_span.hex()}-01"
    client.stub.Generate(
        _request("traced-1"), metadata=(("traceparent", traceparent),), timeout=120
    )
    spans = collector.wait(trace_id, {GENERATE, "llm_request"})
    [(service, ours)] = [(svc, s) for svc, s in spans if s.name == GENERATE]
    assert service == "rollout-service"
    assert ours.kind == trace_pb2.Span.SPAN_KIND_SERVER
    assert ours.parent_span_id == caller_span
    assert _attrs(ours) == {
        "rpc.system": "grpc",
        "rpc.service": "rollout.v1.RolloutService",
        "rpc.method": "Generate",
        "rpc.grpc.status_code": 0,
    }
    # vLLM's own span for the engine request, a child of the RPC's.
    [engine] = [s for _, s in spans if s.name == "llm_request"]
    assert engine.parent_span_id == ours.span_id
    assert _attrs(engine)["gen_ai.request.id"].startswith("traced-1-")


def test_every_rpc_gets_a_span_a_root_without_traceparent(observed):
    collector, client, _ = observed
    chunks = list(client.generate_stream(prompt_text="hi", max_tokens=3, request_id="root-1"))
    assert chunks
    client.server_info()
    with pytest.raises(grpc.RpcError) as e:
        client.stub.Generate(
            pb.GenerateRequest(prompt_text="x", sampling_params=pb.SamplingParams(top_p=7)),
            timeout=30,
        )
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    deadline = time.monotonic() + 60
    while not (
        collector.named("rollout.v1.RolloutService/GetServerInfo")
        and any(
            _attrs(s)["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
            for s in collector.named(GENERATE)
        )
    ):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    [stream] = [
        s
        for s in collector.named("rollout.v1.RolloutService/GenerateStream")
        if s.parent_span_id == b""
    ]
    spans = collector.wait(stream.trace_id, {"llm_request"})
    [engine] = [s for _, s in spans if s.name == "llm_request"]
    assert engine.parent_span_id == stream.span_id
    assert _attrs(engine)["gen_ai.request.id"].startswith("root-1-")
    # Health checks (the readiness wait) are traced too.
    assert collector.named("grpc.health.v1.Health/Check")


def test_metrics_show_vllms_engine_metrics_beside_ours(observed):
    from prometheus_client.parser import text_string_to_metric_families

    _, client, port = observed
    client.generate(prompt_text="metrics", max_tokens=2)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)), "a metric family appears twice"
    samples = {
        (s.name, s.labels.get("model_name")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert (name, "tiny-qwen2") in samples
    assert 0 <= samples[("vllm:kv_cache_usage_perc", "tiny-qwen2")] <= 1
    assert samples[("vllm:prompt_tokens_total", "tiny-qwen2")] > 0
    assert samples[("vllm:generation_tokens_total", "tiny-qwen2")] > 0
    assert ("vllm:num_preemptions_total", "tiny-qwen2") in samples
    # ... next to the service's own.
    assert 'grpc_server_handled_total{grpc_code="OK",grpc_method="Generate"' in text
    assert "rollout_paused 0.0" in text


class _Handlers:
    """A tiny service: one call that fails, one that outlives its deadline,
    one that streams while reading the current span."""

    def __init__(self) -> None:
        self.current: list[int] = []

    async def fail(self, request, context):
        await context.abort(grpc.StatusCode.INTERNAL, "broken")

    async def slow(self, request, context):
        await asyncio.sleep(10)
        return b""

    async def stream(self, request, context):
        from opentelemetry import trace

        for _ in range(3):
            self.current.append(trace.get_current_span().get_span_context().span_id)
            yield b"x"


def test_the_interceptor_records_status_stays_current_and_skips_excluded_services():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    handlers = _Handlers()

    async def main():
        interceptor = grpc_tracing.TracingInterceptor(
            provider.get_tracer("t"), frozenset({"t.Quiet"})
        )
        server = grpc.aio.server(interceptors=[interceptor])
        methods = {
            "Fail": grpc.unary_unary_rpc_method_handler(handlers.fail),
            "Slow": grpc.unary_unary_rpc_method_handler(handlers.slow),
            "Stream": grpc.unary_stream_rpc_method_handler(handlers.stream),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", methods),))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Quiet", methods),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            for method, timeout in (("Fail", 10), ("Slow", 0.5)):
                with pytest.raises(grpc.RpcError):
                    await channel.unary_unary(f"/t.S/{method}")(b"", timeout=timeout)
            assert len([m async for m in channel.unary_stream("/t.S/Stream")(b"")]) == 3
            assert len([m async for m in channel.unary_stream("/t.Quiet/Stream")(b"")]) == 3
        await asyncio.sleep(0.2)  # the cancelled handler's span ends
        await server.stop(0)

    asyncio.run(main())
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["t.S/Fail"].status.status_code == StatusCode.ERROR
    assert spans["t.S/Fail"].attributes["rpc.grpc.status_code"] == 13
    # A call whose client went away is CANCELLED (as the metrics count it), not OK,
    # and not the server's error.
    assert spans["t.S/Slow"].attributes["rpc.grpc.status_code"] == 1
    assert spans["t.S/Slow"].status.status_code == StatusCode.UNSET
    assert not spans["t.S/Fail"].events  # an abort on purpose is no exception
    assert set(handlers.current[:3]) == {spans["t.S/Stream"].context.span_id}
    assert not any(name.startswith("t.Quiet/") for name in spans)  # an excluded service


def test_no_trace_headers_without_an_endpoint():
    # This process never called grpc_tracing.setup: the hot path passes None.
    assert tracing.headers() is None
