"""The suite's servers are forked from one process that imported the command
once (tests/support/serve_forks.py): each must be what `rollout-service
serve` is as a process of its own, or the suite tests something users do not
run. A start refused after vLLM's import (no engine) shows it, run both ways."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from harness.serverproc import TEST_ENGINE_ENV
from tests.support import serve_forks

# Refused once its arguments are parsed, vLLM imported (rollout_service.cli).
LATE_REFUSAL = [serve_forks.SERVE, "serve", "--port", "0", "--tool-call-parser", "no-such-parser"]
# A variable no list says is read on use: a start with it is not forked.
UNLISTED = "ROLLOUT_TESTS_UNLISTED_SETTING"
_STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", re.MULTILINE)


def _run(tmp_path, name: str, env: dict[str, str]):
    out, err = str(tmp_path / f"{name}.out"), str(tmp_path / f"{name}.err")
    proc = serve_forks.start(LATE_REFUSAL, env, out, err)
    code = proc.wait(120)
    read = [_STAMP.sub("", open(p).read()) for p in (out, err)]
    return proc, code, read


@pytest.fixture(scope="module")
def both_ways(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("forked-starts")
    env = {**os.environ, **TEST_ENGINE_ENV}
    return _run(tmp, "forked", env), _run(tmp, "own", {**env, UNLISTED: "1"})


def test_a_forked_start_prints_and_exits_as_a_process_of_its_own(both_ways):
    (forked, forked_code, forked_out), (own, own_code, own_out) = both_ways
    assert isinstance(forked, serve_forks.Forked) and isinstance(own, subprocess.Popen)
    assert forked_code == own_code == 1
    # stdout, stderr: vLLM's import lines (timestamps aside), then the refusal.
    assert forked_out == own_out
    assert "Triton" in own_out[1] and "no-such-parser" in own_out[1].splitlines()[-1], own_out


def test_only_settings_read_on_use_may_differ_from_the_forkers():
    env = {**os.environ, **TEST_ENGINE_ENV}
    assert serve_forks.forkable(LATE_REFUSAL, env)
    assert serve_forks.forkable(LATE_REFUSAL, {**env, "ROLLOUT_SERVICE_CACHE": "/elsewhere"})
    assert serve_forks.forkable(LATE_REFUSAL, {**env, "VLLM_CPU_KVCACHE_SPACE": "3"})
    assert not serve_forks.forkable(LATE_REFUSAL, {**env, UNLISTED: "1"})
    assert not serve_forks.forkable(LATE_REFUSAL, {**env, "TORCHDYNAMO_DISABLE": "0"})
    assert not serve_forks.forkable([*LATE_REFUSAL, "--log-json"], env)
