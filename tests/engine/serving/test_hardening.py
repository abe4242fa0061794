"""Auth, mutual TLS, limits, metrics and stale-segment cleanup, on one server
configured with all of them."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.weights_util import random_weights, version
from rollout_client import RolloutClient, RolloutError


@pytest.fixture(scope="module")
def secure(hardened_server):
    """conftest's hardened_server, its TLS client options and metrics port."""
    return hardened_server, hardened_server.tls, hardened_server.metrics_port


def test_leftover_segments_are_removed_at_start(hardened_server):
    # Written before the server started (conftest's _start_hardened).
    assert not hardened_server.stale_segment.exists()


def test_roles(secure):
    proc, tls, _ = secure
    with RolloutClient(proc.target, token="gen-token", retries=0, **tls) as gen:
        info = gen.server_info()
        assert gen.generate(prompt_text="hi", max_tokens=2).completions
        head = [p for p in info.parameters if p.name == "lm_head.weight"]
        with pytest.raises(RolloutError) as e:
            gen.update_weights(random_weights(head, seed=1), version())
        assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert "admin" in e.value.details and e.value.reason == "ROLE_DENIED"
        with pytest.raises(RolloutError) as e:
            gen.reset_caches()
        assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
    with RolloutClient(proc.target, token="admin-token", **tls) as admin:
        ack = admin.update_weights(random_weights(head, seed=1), version())
        assert admin.server_info().weight_version == ack.weight_version
        assert len(admin.reset_caches().results) == 3


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_missing_or_unknown_token_is_unauthenticated(secure, token):
    proc, tls, _ = secure
    with RolloutClient(proc.target, token=token, retries=0, **tls) as c:
        with pytest.raises(RolloutError) as e:
            c.generate(prompt_text="hi", max_tokens=2)
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert e.value.reason == "AUTH_REQUIRED"
        # health stays open
        assert c._health.Check(health_pb2.HealthCheckRequest()).status == 1


def test_mutual_tls_refuses_clients_without_certificate(secure):
    proc, tls, _ = secure
    with RolloutClient(
        proc.target, token="admin-token", retries=0, root_certificates=tls["root_certificates"]
    ) as c:
        with pytest.raises(RolloutError) as e:
            c.server_info(timeout=5)
        assert e.value.code == grpc.StatusCode.UNAVAILABLE
        assert e.value.reason == "", "a status gRPC made itself carries no reason"
    with grpc.insecure_channel(proc.target) as ch:  # plaintext is refused too
        with pytest.raises(grpc.RpcError):
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)


def test_prompt_limit_names_the_limit(secure):
    proc, tls, _ = secure
    with RolloutClient(proc.target, token="gen-token", **tls) as c:
        with pytest.raises(RolloutError) as e:
            c.generate(prompt_token_ids=[5] * 65, max_tokens=2)
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-prompt-tokens" in e.value.details and e.value.reason == "LIMIT_EXCEEDED"
        assert c.generate(prompt_token_ids=[5] * 64, max_tokens=2).completions


def test_queue_limit_names_the_limit(secure):
    import threading

    proc, tls, _ = secure
    with RolloutClient(proc.target, token="gen-token", retries=0, **tls) as c:
        threads = [
            threading.Thread(
                target=c.generate,
                kwargs=dict(prompt_text="hi", max_tokens=600, ignore_eos=True),
            )
            for _ in range(3)
        ]
        for t in threads:
            t.start()
        import time

        deadline = time.monotonic() + 10
        while c.server_info().engine_requests < 3:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(RolloutError) as e:
            c.generate(prompt_text="hi", max_tokens=2)
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-queued-generate" in e.value.details and e.value.reason == "QUEUE_FULL"
        for t in threads:
            t.join()


def test_rich_error_details(secure):
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    from rollout_client import pb

    proc, tls, _ = secure
    request = pb.GenerateRequest(prompt_text="x", sampling_params=pb.SamplingParams(top_p=7))
    with RolloutClient(proc.target, token="gen-token", retries=0, **tls) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.stub.Generate(request, metadata=c.options.metadata(), timeout=30)
    status = rpc_status.from_call(e.value)
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    assert bad.field_violations[0].field == "sampling_params.top_p"


def test_metrics(secure):
    proc, tls, port = secure
    with RolloutClient(proc.target, token="gen-token", **tls) as c:
        list(c.generate_stream(prompt_text="hi", max_tokens=3))
        with pytest.raises(RolloutError):
            c.generate(prompt_text="hi", n=0)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'grpc_server_handled_total{grpc_code="INVALID_ARGUMENT",grpc_method="Generate"' in text
    assert 'grpc_method="GenerateStream",grpc_service="rollout.v1.RolloutService"' in text
    assert "rollout_generate_time_to_first_token_seconds_count" in text
    assert 'rollout_updates_total{outcome="OK"}' in text  # from test_roles
    assert 'rollout_cache_resets_total{cache="encoder"}' in text
    assert "rollout_weight_info{version=" in text
    assert "rollout_paused 0.0" in text


def test_structured_logs_carry_the_request_id(secure):
    import json

    proc, tls, _ = secure
    with RolloutClient(proc.target, token="gen-token", retries=0, **tls) as c:
        with pytest.raises(RolloutError):
            c.generate(prompt_text="x", top_p=7.0, request_id="trace-me-42")
    entries = []
    for line in proc.log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            entries.append(json.loads(line))
    mine = [e for e in entries if e["request_id"] == "trace-me-42"]
    assert mine and "INVALID_ARGUMENT" in mine[0]["message"] and "top_p" in mine[0]["message"]
    assert {"time", "level", "logger", "message"} <= set(mine[0])


def test_the_cli_authenticates_with_a_token_and_tls_files(secure, tmp_path):
    import json
    import os
    import subprocess
    import sys

    proc, tls, _ = secure
    files = {}
    for name, key in (
        ("ca", "root_certificates"),
        ("cert", "certificate_chain"),
        ("key", "private_key"),
    ):
        files[name] = tmp_path / f"{name}.pem"
        files[name].write_bytes(tls[key])
    cli = [
        str(Path(sys.executable).with_name("rollout-client")),
        "--target", proc.target,
        "--tls-ca", str(files["ca"]),
        "--tls-cert", str(files["cert"]),
        "--tls-key", str(files["key"]),
    ]  # fmt: skip

    def run(*args, token=None):
        env = {k: v for k, v in os.environ.items() if k != "ROLLOUT_TOKEN"}
        if token:
            env["ROLLOUT_TOKEN"] = token
        return subprocess.run([*cli, *args], capture_output=True, text=True, env=env, timeout=60)

    ok = run("--json", "info", token="gen-token")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["weight_version"]
    denied = run("reset-caches", token="gen-token")
    assert denied.returncode == 1 and "PERMISSION_DENIED" in denied.stderr
    assert run("reset-caches", token="admin-token").returncode == 0
    anonymous = run("info")
    assert anonymous.returncode == 1 and "UNAUTHENTICATED" in anonymous.stderr
