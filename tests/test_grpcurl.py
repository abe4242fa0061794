"""The README's `grpcurl` session, through server reflection only: every
command run here is printed in the README exactly so, at 127.0.0.1:50051."""

from __future__ import annotations

import json
import shlex

import pytest
from google.protobuf import json_format

from rollout_client import pb
from tests.support.shell import README, rollout_methods, run, venv_tool

GRPCURL = venv_tool("grpcurl")
README_TARGET = "127.0.0.1:50051"


def readme_line(args: tuple[str, ...], data: dict | None) -> str:
    """The command as the README prints it, after `G=".venv/bin/grpcurl -plaintext"`."""
    words = shlex.join([README_TARGET, *args])
    if data is None:
        return f"$ $G {words}"
    line = f"$ $G -d {shlex.quote(json.dumps(data))} {words}"
    if len(line) <= 100:
        return line
    return f"$ $G -d {shlex.quote(json.dumps(data))} \\\n    {words}"


def grpcurl(server, *args: str, data: dict | None = None) -> str:
    """`grpcurl -plaintext [-d DATA] TARGET ARGS...` on the session server: its stdout."""
    assert readme_line(args, data) in README.read_text(), "the README shows this command"
    flags = ["-plaintext", *(["-d", json.dumps(data)] if data is not None else [])]
    p = run([GRPCURL, *flags, server.target, *args])
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_list_services(server):
    services = set(grpcurl(server, "list").split())
    assert {"rollout.v1.RolloutService", "grpc.health.v1.Health"} <= services


def test_describe_service(server):
    out = grpcurl(server, "describe", "rollout.v1.RolloutService")
    assert "service RolloutService {" in out
    for method in rollout_methods():
        name = method.rsplit("/", 1)[1]
        assert f"rpc {name} (" in out, f"describe shows {name}"


def test_generate(server, client):
    data = {"prompt_text": "Hello", "sampling_params": {"max_tokens": 4, "temperature": 0}}
    out = grpcurl(server, "rollout.v1.RolloutService/Generate", data=data)
    r = json_format.Parse(out, pb.GenerateResponse())
    # Greedy: the same tokens as the Python client gets for the same request.
    expected = client.generate(prompt_text="Hello", max_tokens=4, temperature=0)
    (got,), (want,) = r.completions, expected.completions
    assert len(got.token_ids) == 4
    assert list(got.token_ids) == list(want.token_ids)
    assert list(got.logprobs) == pytest.approx(list(want.logprobs), abs=1e-3)
    assert got.text == want.text
    assert r.usage == expected.usage
    assert r.weight_version == expected.weight_version


def test_reset_caches(server, client):
    out = json.loads(grpcurl(server, "rollout.v1.RolloutService/ResetCaches"))
    caches = [pb.CacheKind.Name(x.cache) for x in client.reset_caches().results]
    assert [x["cache"] for x in out["results"]] == caches
    assert all(x["reset"] for x in out["results"])


def test_health_check(server):
    out = grpcurl(server, "grpc.health.v1.Health/Check", data={"service": ""})
    assert json.loads(out)["status"] == "SERVING"
