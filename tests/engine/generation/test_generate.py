"""Generate and GenerateStream against the real engine."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rollout_client import RolloutError, pb

PROMPT = "The quick brown fox jumps over the lazy dog"


def greedy(client, **kw):
    kw.setdefault("prompt_text", PROMPT)
    return client.generate(max_tokens=12, temperature=0, **kw)


def collect_stream(client, **kw):
    kw.setdefault("prompt_text", PROMPT)
    tokens, logprobs, finish, usage, versions = [], [], None, None, set()
    text = []
    for delta in client.generate_stream(max_tokens=12, temperature=0, **kw):
        text.append(delta.text)
        tokens += delta.token_ids
        logprobs += delta.logprobs
        versions.add(delta.weight_version)
        if delta.finish_reason:
            finish = delta.finish_reason
        if delta.HasField("usage"):
            usage = delta.usage
    return tokens, logprobs, finish, usage, versions, "".join(text)


def test_greedy_is_deterministic_and_tagged(client):
    a, b = greedy(client), greedy(client)
    ca, cb = a.completions[0], b.completions[0]
    assert len(ca.token_ids) == 12 and ca.finish_reason == pb.FINISH_REASON_LENGTH
    assert list(ca.token_ids) == list(cb.token_ids)
    assert list(ca.logprobs) == pytest.approx(list(cb.logprobs), abs=1e-5)
    assert len(ca.logprobs) == len(ca.token_ids) and all(lp <= 0 for lp in ca.logprobs)
    assert a.weight_version == client.server_info().weight_version != ""
    assert a.usage.completion_tokens == 12 and a.usage.prompt_tokens > 0
    assert ca.text  # the embedded model has a tokenizer


def test_stream_equals_unary(client):
    unary = greedy(client).completions[0]
    tokens, logprobs, finish, usage, versions, text = collect_stream(client)
    assert tokens == list(unary.token_ids)
    # unary text is decoded once at the end, streamed text incrementally by vLLM
    assert text == unary.text and text
    assert logprobs == pytest.approx(list(unary.logprobs), abs=1e-5)
    assert finish == unary.finish_reason
    assert usage.completion_tokens == len(tokens) and usage.prompt_tokens > 0
    assert len(versions) == 1


def test_text_and_token_ids_agree(client):
    from transformers import AutoTokenizer

    from rollout_service.engine.tiny_models import ensure_model

    ids = AutoTokenizer.from_pretrained(ensure_model("tiny-qwen2")).encode(PROMPT)
    by_text = greedy(client).completions[0]
    by_ids = greedy(client, prompt_text=None, prompt_token_ids=ids).completions[0]
    assert list(by_text.token_ids) == list(by_ids.token_ids)
    assert list(by_text.logprobs) == pytest.approx(list(by_ids.logprobs), abs=1e-5)


def test_n_completions_and_top_logprobs(client):
    r = client.generate(prompt_text=PROMPT, max_tokens=6, temperature=1.0, n=3, seed=7, logprobs=3)
    assert [c.index for c in r.completions] == [0, 1, 2]
    for c in r.completions:
        assert len(c.top_logprobs) == len(c.token_ids) == 6
        for pos, lp in enumerate(c.logprobs):
            top = c.top_logprobs[pos]
            assert len(top.token_ids) == 3
            assert list(top.logprobs) == sorted(top.logprobs, reverse=True)
            # the sampled token is never more likely than the best alternative
            assert lp <= top.logprobs[0] + 1e-5
    assert r.usage.completion_tokens == 18


def test_seed_makes_sampling_reproducible(client):
    kw = dict(prompt_text=PROMPT, max_tokens=10, temperature=1.0, seed=1234)
    a, b = client.generate(**kw), client.generate(**kw)
    assert list(a.completions[0].token_ids) == list(b.completions[0].token_ids)


def test_stop_token_ids_stop(client):
    full = list(greedy(client).completions[0].token_ids)
    stop_at = full[3]
    first = full.index(stop_at)
    r = greedy(client, stop_token_ids=[stop_at]).completions[0]
    assert r.finish_reason == pb.FINISH_REASON_STOP
    assert list(r.token_ids) == full[: first + 1]
    assert r.stop_reason == str(stop_at)


def test_stop_strings_stop(client):
    full = greedy(client).completions[0]
    stop = full.text[len(full.text) // 2 :][:3]
    assert stop.strip(), full.text
    r = greedy(client, stop=[stop]).completions[0]
    assert r.finish_reason == pb.FINISH_REASON_STOP
    assert stop not in r.text and len(r.token_ids) < len(full.token_ids)
    assert full.text.startswith(r.text)


INVALID = [
    ({"prompt_text": None}, "prompt_token_ids/prompt_text/messages"),
    ({"prompt_token_ids": [1, 2]}, "prompt_token_ids/prompt_text/messages"),  # both
    ({"prompt_text": None, "prompt_token_ids": [1, 100000]}, "prompt_token_ids[1]"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 1_000_000}, "max_tokens"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"n": 0}, "n"),
    ({"logprobs": 1000}, "logprobs"),
    ({"images": [b"\x89PNG not really"]}, "images"),
    ({"stop_token_ids": [99999]}, "stop_token_ids[0]"),
]


@pytest.mark.parametrize(("overrides", "field"), INVALID, ids=[f for _, f in INVALID])
def test_invalid_requests_are_rejected_and_server_keeps_serving(client, overrides, field):
    kw = {"prompt_text": PROMPT, "max_tokens": 4, **overrides}
    for call in (client.generate, lambda **k: list(client.generate_stream(**k))):
        with pytest.raises(RolloutError) as e:
            call(**kw)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert field in e.value.details
    assert len(greedy(client).completions[0].token_ids) == 12


def wait_engine_idle(client, timeout=10.0):
    deadline = time.monotonic() + timeout
    while client.server_info().engine_requests:
        assert time.monotonic() < deadline, "engine requests were not freed"
        time.sleep(0.05)


def test_cancelled_stream_frees_engine_request(server, client):
    channel = grpc.insecure_channel(server.target)
    stub = pb_grpc_stub(channel)
    request = pb.GenerateStreamRequest(
        prompt_text=PROMPT,
        sampling_params=pb.SamplingParams(max_tokens=1500, ignore_eos=True, temperature=0),
    )
    call = stub.GenerateStream(request)
    next(call), next(call)
    assert client.server_info().engine_requests == 1
    call.cancel()
    wait_engine_idle(client)
    channel.close()


def test_deadline_aborts_engine_request(client):
    with pytest.raises(RolloutError) as e:
        client.generate(prompt_text=PROMPT, max_tokens=1500, ignore_eos=True, timeout=0.3)
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_engine_idle(client)


def test_concurrent_requests(client):
    results = []

    def run(i):
        results.append(
            client.generate(prompt_token_ids=[10 + i, 20, 30], max_tokens=8, ignore_eos=True)
        )

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(len(r.completions[0].token_ids) == 8 for r in results)


def test_health_serving(server):
    with grpc.insecure_channel(server.target) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for service in ("", "rollout.v1.RolloutService"):
            r = stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert r.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_and_describes_the_service(server):
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    with grpc.insecure_channel(server.target) as ch:
        db = ProtoReflectionDescriptorDatabase(ch)
        services = db.get_services()
        assert "rollout.v1.RolloutService" in services
        assert "grpc.health.v1.Health" in services
        pool = DescriptorPool(db)
        svc = pool.FindServiceByName("rollout.v1.RolloutService")
        assert {m.name for m in svc.methods} == {
            "Generate",
            "GenerateStream",
            "GenerateMany",
            "UpdateWeights",
            "BeginUpdate",
            "UploadChunks",
            "GetUpdateStatus",
            "CommitUpdate",
            "AbortUpdate",
            "ResetCaches",
            "GetServerInfo",
            "Abort",
            "Tokenize",
            "Detokenize",
            "Sleep",
            "WakeUp",
            "OpenSession",
            "SessionGenerate",
            "SessionGenerateStream",
            "AppendToSession",
            "GetSession",
            "CloseSession",
        }


def test_server_info(info):
    assert info.model == "tiny-qwen2"
    assert info.vocab_size == 512 and info.max_model_len == 2048
    assert not info.supports_images
    names = {p.name for p in info.parameters}
    assert "lm_head.weight" in names and "model.embed_tokens.weight" in names
    assert all(p.dtype == pb.D_TYPE_BFLOAT16 for p in info.parameters)
    assert info.max_message_bytes > info.recommended_chunk_bytes > 0
    assert info.max_update_bytes >= sum(2 * _prod(p.shape) for p in info.parameters)


def _prod(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def pb_grpc_stub(channel):
    from rollout.v1 import rollout_pb2_grpc

    return rollout_pb2_grpc.RolloutServiceStub(channel)
