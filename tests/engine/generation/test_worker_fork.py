"""vLLM's engine core forks its workers (rollout_service.engine.worker_fork): a
worker does not import vLLM a second time, and still runs on the CPUs vLLM
chose for it. The engine core itself is a copy of the server forked ahead
(rollout_service.engine.core_fork)."""

from __future__ import annotations

import os

import psutil
import pytest

from rollout_service.engine import core_fork, vllm_compat, worker_fork
from tests.support.cpus import thread_cpus, vllm_process


def _torch_address(proc: psutil.Process) -> str:
    """Where the process mapped libtorch: a fork keeps its parent's layout,
    an exec'd process gets its own (address space layout randomisation)."""
    found = {
        m.addr.split("-")[0] for m in proc.memory_maps(grouped=False) if "libtorch_cpu" in m.path
    }
    assert found, "libtorch is not mapped"
    return min(found)


def test_the_engine_core_forks_its_worker_bound_to_its_cpus(server, client):
    client.generate(prompt_token_ids=[1, 2, 3], max_tokens=2)
    with open("/proc/sys/kernel/randomize_va_space") as f:
        assert f.read().strip() != "0", "with ASLR off a spawned worker maps libtorch alike"
    root = psutil.Process(server.proc.pid)
    core, worker = vllm_process(root, "VLLM::EngineCore"), vllm_process(root, "VLLM::Worker")
    assert worker.ppid() == core.pid
    assert _torch_address(worker) == _torch_address(core), "the worker was spawned"
    # vLLM's binding reached it: its threads keep to the worker's CPUs.
    assert thread_cpus(worker) < os.sched_getaffinity(0), "the worker runs on every CPU"


def test_the_engine_core_is_a_copy_of_the_server(server, client):
    client.generate(prompt_token_ids=[1, 2, 3], max_tokens=2)
    root = psutil.Process(server.proc.pid)
    core = vllm_process(root, "VLLM::EngineCore")
    assert core.ppid() == root.pid
    assert _torch_address(core) == _torch_address(root), "the engine core was spawned"
    waiting = [p for p in root.children(recursive=True) if core_fork.TITLE in " ".join(p.cmdline())]
    assert not waiting, "a copy forked ahead is left over"


@pytest.mark.parametrize(
    "env",
    [
        {"GOMP_CPU_AFFINITY": "2 3", "OMP_NUM_THREADS": "2"},
        {"KMP_AFFINITY": "granularity=fine,explicit,proclist=[2,3]", "OMP_NUM_THREADS": "2"},
        {"OMP_PLACES": "{2,3}", "OMP_PROC_BIND": "true", "OMP_NUM_THREADS": "2"},
    ],
)
def test_each_form_of_vllms_binding_is_read(env):
    assert vllm_compat.omp_binding(env) == ({2, 3}, 2)


def test_no_binding_or_a_malformed_one_binds_nothing():
    assert vllm_compat.omp_binding({}) is None
    assert vllm_compat.omp_binding({"OMP_NUM_THREADS": "4"}) is None
    assert vllm_compat.omp_binding({"GOMP_CPU_AFFINITY": "0-3", "OMP_NUM_THREADS": "4"}) is None


def test_spawn_asked_by_the_user_is_kept(monkeypatch):
    monkeypatch.delenv(worker_fork.ENV, raising=False)
    monkeypatch.setenv(worker_fork.VLLM_METHOD, "spawn")
    worker_fork.arm()
    assert worker_fork.ENV not in os.environ
    monkeypatch.delenv(worker_fork.VLLM_METHOD)
    worker_fork.arm()
    assert os.environ[worker_fork.ENV] == "1"


def test_spawn_asked_by_the_user_spawns_the_engine_core_too(monkeypatch):
    monkeypatch.setenv(worker_fork.VLLM_METHOD, "spawn")
    assert not core_fork.fork_ahead(cpu_host=True)
    assert core_fork._ahead is None
