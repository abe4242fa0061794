"""The suite's servers are forked from one process that imported the command
once (tests/support/serve_forks.py): each must be what `rollout-service
serve` is as a process of its own, or the suite tests something users do not
run. A start refused after vLLM's import (no engine) shows it, run both ways."""

from __future__ import annotations

import os
import re

import pytest

from harness.serverproc import TEST_ENGINE_ENV
from tests.support import forker, serve_forks

# Refused once its arguments are parsed, vLLM imported (rollout_service.cli).
LATE_REFUSAL = [forker.SERVE, "serve", "--port", "0", "--tool-call-parser", "no-such-parser"]
# A variable no list says is read on use: a start with it is not forked.
UNLISTED = "ROLLOUT_TESTS_UNLISTED_SETTING"
_STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", re.MULTILINE)


def _start(tmp, name: str, env: dict[str, str]):
    out, err = str(tmp / f"{name}.out"), str(tmp / f"{name}.err")
    return serve_forks.start(LATE_REFUSAL, env, out, err), (out, err)


def _ended(started):
    proc, files = started
    code = proc.wait(120)
    return proc, code, [_STAMP.sub("", open(p).read()) for p in files]


@pytest.fixture(scope="module")
def both_ways(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("forked-starts")
    env = {**os.environ, **TEST_ENGINE_ENV}
    forked, own = _start(tmp, "forked", env), _start(tmp, "own", {**env, UNLISTED: "1"})
    return _ended(forked), _ended(own)


def test_a_forked_start_prints_and_exits_as_a_process_of_its_own(both_ways):
    (forked, forked_code, forked_out), (own, own_code, own_out) = both_ways
    assert forked.forked and own.not_forked == [UNLISTED]
    assert forked_code == own_code == 1
    # stdout, stderr: vLLM's import lines (timestamps aside), then the refusal.
    assert forked_out == own_out
    assert "Triton" in own_out[1] and "no-such-parser" in own_out[1].splitlines()[-1], own_out


@pytest.mark.parametrize(
    ("change", "not_forked"),
    [
        ({"ROLLOUT_SERVICE_CACHE": "/elsewhere"}, []),  # the suite's, read on use
        ({"VLLM_CPU_KVCACHE_SPACE": "3"}, []),  # vLLM's, read on use
        ({UNLISTED: "1"}, [UNLISTED]),
        ({"TORCHDYNAMO_DISABLE": "0"}, ["TORCHDYNAMO_DISABLE"]),  # read at torch's import
    ],
)
def test_only_settings_read_on_use_may_differ_from_the_forkers(tmp_path, change, not_forked):
    env = {**os.environ, **TEST_ENGINE_ENV, **change}
    proc = serve_forks.start([*LATE_REFUSAL, "--help"], env, *[str(tmp_path / "log")] * 2)
    proc.kill()  # only how it started counts
    proc.wait(60)
    assert proc.not_forked == not_forked


def test_json_logs_are_not_forked(tmp_path):
    env = {**os.environ, **TEST_ENGINE_ENV}
    proc = serve_forks.start([*LATE_REFUSAL, "--log-json"], env, *[str(tmp_path / "log")] * 2)
    proc.kill()
    proc.wait(60)
    assert proc.not_forked == ["--log-json"]


def test_a_setting_as_the_commands_imports_set_it_may_differ(tmp_path):
    # vLLM's cv2 puts its libraries on LD_LIBRARY_PATH at its import: this
    # process has it once it imported cv2, the forker from its own imports.
    import cv2  # noqa: F401

    env = {**os.environ, **TEST_ENGINE_ENV}
    assert "cv2" in env["LD_LIBRARY_PATH"]
    proc = serve_forks.start([*LATE_REFUSAL, "--help"], env, *[str(tmp_path / "log")] * 2)
    proc.kill()
    proc.wait(60)
    assert proc.not_forked == []
