"""The README's `buf curl` session, through server reflection only."""

from __future__ import annotations

import json

from tests.support.shell import README, rollout_methods, run, venv_tool

BUF = venv_tool("buf")


def curl(server, *args, data=None):
    cmd = [BUF, "curl", "--protocol", "grpc", "--http2-prior-knowledge", *args]
    if data is not None:
        cmd += ["-d", json.dumps(data)]
    return run(cmd)


def url(server, method=""):
    return f"http://{server.target}/{method}"


def test_list_methods(server):
    p = curl(server, "--list-methods", url(server))
    assert p.returncode == 0, p.stderr
    methods = set(p.stdout.split())
    every = rollout_methods()
    assert every <= methods, "reflection lists every RPC of the proto"
    assert "grpc.health.v1.Health/Check" in methods
    readme = README.read_text()
    assert all(m in readme for m in every), "the README's --list-methods block is current"


def test_generate_get_info_reset_and_health(server, info):
    p = curl(
        server,
        url(server, "rollout.v1.RolloutService/Generate"),
        data={"prompt_text": "Hello", "sampling_params": {"max_tokens": 4, "temperature": 0}},
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert len(r["completions"][0]["tokenIds"]) == 4
    assert len(r["completions"][0]["logprobs"]) == 4

    p = curl(server, url(server, "rollout.v1.RolloutService/GetServerInfo"))
    assert json.loads(p.stdout)["model"] == info.model

    p = curl(server, url(server, "rollout.v1.RolloutService/ResetCaches"))
    assert [x["reset"] for x in json.loads(p.stdout)["results"]] == [True, True, True]

    p = curl(server, url(server, "grpc.health.v1.Health/Check"), data={"service": ""})
    assert json.loads(p.stdout)["status"] == "SERVING"


def test_invalid_request_error_shows_the_field(server):
    p = curl(
        server,
        url(server, "rollout.v1.RolloutService/Generate"),
        data={"prompt_text": "Hello", "sampling_params": {"top_p": 3}},
    )
    assert p.returncode != 0
    err = json.loads(p.stdout or p.stderr)
    assert err["code"] == "invalid_argument" and "top_p" in err["message"]
