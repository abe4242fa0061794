"""rollout_client against the real server: both clients, every method,
every weight source, typed errors, deadlines, retries."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
import torch
from safetensors.torch import save_file

from harness.serverproc import free_port
from harness.weights_util import random_weights, version
from rollout.v1 import rollout_pb2_grpc
from rollout_client import AsyncRolloutClient, ManifestMismatch, RolloutClient, RolloutError, pb
from rollout_service.engine.tiny_models import ensure_model


def test_async_client_has_the_same_surface(server, info):
    async def main():
        async with AsyncRolloutClient(server.target, timeout=60) as c:
            await c.wait_until_ready(30)
            got = await c.server_info()
            r = await c.generate(prompt_text="Hello", max_tokens=6, temperature=0)
            deltas = [
                d async for d in c.generate_stream(prompt_text="Hello", max_tokens=6, temperature=0)
            ]
            head = [p for p in got.parameters if p.name == "lm_head.weight"]
            ack = await c.update_weights(random_weights(head, seed=41), version())
            after = await c.generate(prompt_text="Hello", max_tokens=6, temperature=0)
            reset = await c.reset_caches()
            return got, r, deltas, ack, after, reset

    got, r, deltas, ack, after, reset = asyncio.run(main())
    assert got.model == info.model
    assert [t for d in deltas for t in d.token_ids] == list(r.completions[0].token_ids)
    assert after.weight_version == ack.weight_version
    assert len(reset.results) == 3


def test_weight_sources(client, tmp_path):
    """A module's named_parameters, a state_dict, a safetensors file and a
    plain iterator all push; the result equals the same weights pushed as a dict."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        ensure_model("tiny-qwen2"), torch_dtype=torch.bfloat16
    )
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)

    def out():
        r = client.generate(prompt_token_ids=[5, 6, 7, 8], max_tokens=8, temperature=0)
        return list(r.completions[0].token_ids), list(r.completions[0].logprobs)

    client.update_weights(model, version())
    from_module = out()
    client.update_weights(random_weights(client.server_info().parameters, seed=3), version())
    assert out() != from_module
    state = {k: v for k, v in model.state_dict().items() if not k.endswith("rotary_emb.inv_freq")}
    client.update_weights(state, version())
    assert out() == from_module
    f = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, f)
    client.update_weights(random_weights(client.server_info().parameters, seed=4), version())
    client.update_weights(str(f), version(), checksum=True, chunk_bytes=4096)
    assert out() == from_module
    client.update_weights(iter(list(state.items())), version())
    assert out() == from_module


def test_manifest_mismatch_fails_before_sending(client):
    before = client.server_info().weight_version
    with pytest.raises(ManifestMismatch, match="not a parameter"):
        client.update_weights({"nope.weight": torch.zeros(2, dtype=torch.bfloat16)}, version())
    with pytest.raises(ManifestMismatch, match="dtype"):
        client.update_weights({"lm_head.weight": torch.zeros(512, 128)}, version())
    assert client.server_info().weight_version == before


def test_errors_are_typed_with_the_server_message(client):
    with pytest.raises(RolloutError) as e:
        client.generate(prompt_text="x", n=0)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "sampling_params.n" in e.value.details


def test_deadline(client):
    with pytest.raises(RolloutError) as e:
        client.generate(prompt_text="x", max_tokens=1500, ignore_eos=True, timeout=0.2)
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_cancel_a_stream_midway(client):
    stream = client.generate_stream(prompt_text="x", max_tokens=1500, ignore_eos=True)
    first = next(stream)
    assert first.token_ids
    stream.close()  # the generator closes the call
    deadline = time.monotonic() + 10
    while client.server_info().engine_requests:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_unavailable_is_retried_with_backoff_then_raised():
    target = f"127.0.0.1:{free_port()}"  # nothing listens there
    with RolloutClient(target, retries=2, backoff=0.2, timeout=2) as c:
        t0 = time.monotonic()
        with pytest.raises(RolloutError) as e:
            c.server_info()
        assert e.value.code == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - t0 >= 0.2 + 0.4


def test_invalid_argument_is_not_retried(client):
    calls = []
    real = client.stub.Generate

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    client.stub.Generate = counting
    try:
        with pytest.raises(RolloutError):
            client.generate(prompt_text="x", top_p=5.0)
    finally:
        client.stub.Generate = real
    assert len(calls) == 1


def test_bearer_token_is_sent_as_metadata():
    from rollout_client.client import ConnectionOptions

    assert ConnectionOptions(token="s3cret").metadata() == (("authorization", "Bearer s3cret"),)
    assert ConnectionOptions().metadata() is None
    assert pb.PAUSE_MODE_WAIT == 1


class FlakyServer(rollout_pb2_grpc.RolloutServiceServicer):
    """An in-process stand-in for the service: GetServerInfo and UpdateWeights,
    of which those named in `failing` fail with `code` on their first
    `failures` attempts. Counts the attempts that reach it."""

    def __init__(
        self, failures: int, code=grpc.StatusCode.UNAVAILABLE, failing=("GetServerInfo",)
    ) -> None:
        from concurrent import futures

        self.failures, self.code, self.failing = failures, code, failing
        self.attempts: dict[str, int] = {}
        self.chunks = 0
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        rollout_pb2_grpc.add_RolloutServiceServicer_to_server(self, self.server)
        self.target = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def _attempt(self, name: str, context) -> None:
        n = self.attempts[name] = self.attempts.get(name, 0) + 1
        if name in self.failing and n <= self.failures:
            context.abort(self.code, f"attempt {n} of {name} refused")

    def GetServerInfo(self, request, context):
        self._attempt("GetServerInfo", context)
        spec = pb.TensorSpec(name="w", dtype=pb.D_TYPE_FLOAT32, shape=[4])
        return pb.GetServerInfoResponse(model="flaky", parameters=[spec])

    def UpdateWeights(self, request_iterator, context):
        messages = list(request_iterator)  # the whole stream arrives before the refusal
        self.chunks += sum(m.HasField("chunk") for m in messages)
        self._attempt("UpdateWeights", context)
        return pb.UpdateWeightsResponse(weight_version=messages[0].begin.weight_version)

    def __enter__(self) -> FlakyServer:
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop(None)


def test_retry_policy_sends_unavailable_calls_again_sync_and_async():
    with FlakyServer(failures=2) as s:
        with RolloutClient(s.target, retries=2, backoff=0.01, timeout=10) as c:
            assert c.server_info().parameters[0].name == "w"
        assert s.attempts["GetServerInfo"] == 3

    async def on_asyncio(target):
        async with AsyncRolloutClient(target, retries=2, backoff=0.01, timeout=10) as c:
            return await c.server_info()

    with FlakyServer(failures=2) as s:
        assert asyncio.run(on_asyncio(s.target)).parameters[0].name == "w"
        assert s.attempts["GetServerInfo"] == 3
    with FlakyServer(failures=3) as s:
        with pytest.raises(RolloutError) as e:
            asyncio.run(on_asyncio(s.target))
        assert e.value.code == grpc.StatusCode.UNAVAILABLE
        assert s.attempts["GetServerInfo"] == 3


@pytest.mark.parametrize("code", [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL])
def test_only_unavailable_is_retried(code):
    with FlakyServer(failures=1, code=code) as s, RolloutClient(s.target, timeout=10) as c:
        with pytest.raises(RolloutError) as e:
            c.server_info()
        assert e.value.code == code
        assert s.attempts["GetServerInfo"] == 1
    with FlakyServer(failures=1) as s, RolloutClient(s.target, retries=0, timeout=10) as c:
        with pytest.raises(RolloutError):
            c.server_info()
        assert s.attempts["GetServerInfo"] == 1


def test_a_refused_update_is_sent_again_whole():
    """UpdateWeights is left out of gRPC's policy (a client stream); the client
    sends the whole update again, which the server answers with the original
    acknowledgement if it had applied it (see updates.send_update)."""
    import numpy as np

    with FlakyServer(failures=1, failing=("UpdateWeights",)) as s:
        with RolloutClient(s.target, retries=1, backoff=0.01, timeout=10) as c:
            ack = c.update_weights({"w": np.ones(4, dtype=np.float32)}, "v-again", chunk_bytes=8)
        assert ack.weight_version == "v-again"
        assert s.attempts["UpdateWeights"] == 2
        assert s.chunks == 2 * 2  # both attempts carried every chunk


def test_connection_options_map_onto_grpc_retry_policy():
    import json

    from rollout_client.client import ConnectionOptions

    config = json.loads(ConnectionOptions(retries=3, backoff=0.4).service_config())
    (method,) = config["methodConfig"]
    assert {n["method"] for n in method["name"]} >= {"Generate", "GetServerInfo", "ResetCaches"}
    assert not {n["method"] for n in method["name"]} & {"UpdateWeights", "UploadChunks"}
    policy = method["retryPolicy"]
    assert policy["maxAttempts"] == 4
    assert policy["retryableStatusCodes"] == ["UNAVAILABLE"]
    # gRPC's +-20% jitter never brings a wait under backoff * 2**i
    assert float(policy["initialBackoff"].rstrip("s")) * 0.8 == pytest.approx(0.4)
    assert json.loads(ConnectionOptions(retries=0).service_config()) == {"methodConfig": []}
    with pytest.raises(ValueError, match="at most 4"):
        ConnectionOptions(retries=5)
