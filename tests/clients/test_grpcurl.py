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


def _block(heading: str) -> str:
    """The first sh block under `heading` in docs/shell.md, as a script."""
    text = README.read_text().split(heading, 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return "".join(
        line[2:] if line.startswith("$ ") else line for line in text.splitlines(keepends=True)
    )


def test_the_session_shown_in_shell_md(server, client):
    script = _block("## A session from the shell").replace(README_TARGET, server.target)
    # The server is shared: other tests' sessions may be open; the script's is not after it.
    open_before = client.server_info().open_sessions
    p = run(["bash", "-euo", "pipefail", "-c", f'G="{GRPCURL} -plaintext"\n{script}'])
    assert p.returncode == 0, p.stderr
    decoder = json.JSONDecoder()
    answers, rest = [], p.stdout.strip()
    while rest:
        value, end = decoder.raw_decode(rest)
        answers.append(value)
        rest = rest[end:].strip()
    turn, appended, held, closed = answers
    r = json_format.Parse(json.dumps(turn), pb.SessionGenerateResponse())
    prompt = list(client.tokenize(text="Hello").token_ids)
    want = client.generate(prompt_token_ids=prompt, max_tokens=4, temperature=0)
    assert list(r.completion.token_ids) == list(want.completions[0].token_ids)
    t = json_format.Parse(json.dumps(held), pb.GetSessionResponse())
    assert list(t.token_ids) == prompt + list(r.completion.token_ids) + [5, 17, 42]
    assert json_format.Parse(json.dumps(appended), pb.AppendToSessionResponse()).total_tokens == (
        len(t.token_ids)
    )
    assert closed == {}
    assert client.server_info().open_sessions == open_before
