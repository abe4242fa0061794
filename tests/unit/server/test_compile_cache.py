"""vLLM's saved compiled model is skipped on a CPU host, where loading it
fails (rollout_service/engine/compile_cache.py)."""

from __future__ import annotations

import os

import pytest

from rollout_service.engine import compile_cache


@pytest.fixture
def env(monkeypatch):
    monkeypatch.delenv(compile_cache.AOT_ENV, raising=False)
    return monkeypatch


def test_a_cpu_host_compiles_without_the_saved_artifact(env):
    assert compile_cache.arm(cpu_host=True)
    assert os.environ[compile_cache.AOT_ENV] == "0"


def test_a_gpu_host_keeps_vllms_default(env):
    assert not compile_cache.arm(cpu_host=False)
    assert compile_cache.AOT_ENV not in os.environ


@pytest.mark.parametrize("value", ["1", "0"])
def test_the_users_value_is_kept(env, value):
    env.setenv(compile_cache.AOT_ENV, value)
    assert not compile_cache.arm(cpu_host=True)
    assert os.environ[compile_cache.AOT_ENV] == value
