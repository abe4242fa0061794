"""On a CPU host the server and vLLM's engine core keep off the cores vLLM
binds its worker to (rollout_service.engine.placement), so they never preempt it."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import psutil
import pytest

from rollout_service.engine.placement import (
    BIND_ENV,
    PlacementError,
    bind_cpu_workers,
    keep_off_worker_cores,
    worker_binding,
)
from tests.support.cpus import thread_cpus, vllm_process


def test_server_and_engine_core_run_off_the_worker_cores(server, client):
    client.generate(prompt_token_ids=[1, 2, 3], max_tokens=2)  # a serving server
    root = psutil.Process(server.proc.pid)
    worker_cpus = thread_cpus(vllm_process(root, "VLLM::Worker"))
    assert worker_cpus < os.sched_getaffinity(0), "vLLM bound its worker to every CPU"
    for proc in (root, vllm_process(root, "VLLM::EngineCore")):
        assert not thread_cpus(proc) & worker_cpus, " ".join(proc.cmdline())


# A stand-in for the engine's process tree: a parent with one child bound to
# the first CPU (the "worker") and one child left floating.
_TREE = """
import os, subprocess, sys, time
first = min(os.sched_getaffinity(0))
bound = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
os.sched_setaffinity(bound.pid, {first})
floating = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(bound.pid, floating.pid, flush=True)
time.sleep(60)
"""


@pytest.fixture
def tree():
    root = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True)
    bound, floating = (psutil.Process(int(p)) for p in root.stdout.readline().split())
    yield psutil.Process(root.pid), bound, floating
    for p in (bound, floating):
        p.kill()
    root.kill()
    root.wait()


def test_moves_the_root_and_floating_processes_off_bound_cpus(tree):
    root, bound, floating = tree
    allowed = os.sched_getaffinity(0)
    first = min(allowed)
    assert keep_off_worker_cores(root.pid) == ({first}, allowed - {first})
    assert thread_cpus(root) == allowed - {first}
    assert thread_cpus(floating) == allowed - {first}
    assert thread_cpus(bound) == {first}


def test_nothing_moves_without_a_bound_process(tree):
    root, bound, floating = tree
    os.sched_setaffinity(bound.pid, os.sched_getaffinity(0))
    assert keep_off_worker_cores(root.pid) is None
    assert thread_cpus(root) == os.sched_getaffinity(0)


# --- binding several CPU workers (tests/engine/generation/test_parallel.py starts one) --------


@pytest.mark.parametrize(
    ("workers", "cpus", "numa_nodes", "expected"),
    [
        (2, [0, 1], 1, "0|1"),  # this machine: a core each, none left over
        (2, list(range(8)), 1, "0,1,2|4,5,6"),  # a core each left to the rest
        (2, [2, 3, 6, 7], 1, "2|6"),  # the allowed CPUs, not the machine's
        (3, list(range(7)), 1, "0|2|4"),  # the odd CPU out goes to the rest
        (1, [0, 1], 1, None),  # one worker: vLLM binds it
        (2, list(range(8)), 2, None),  # a NUMA node each: vLLM binds them
    ],
)
def test_each_cpu_worker_gets_its_own_cpus(workers, cpus, numa_nodes, expected):
    assert worker_binding(workers, cpus, numa_nodes) == expected


def test_fewer_cpus_than_workers_is_refused_naming_the_variable():
    with pytest.raises(PlacementError, match=BIND_ENV):
        worker_binding(2, [0], 1)


def test_a_binding_set_by_the_user_is_left_alone(monkeypatch):
    monkeypatch.setenv(BIND_ENV, "nobind")
    tp2 = SimpleNamespace(tensor_parallel_size=2, pipeline_parallel_size=1)
    assert bind_cpu_workers(tp2) is None
    assert os.environ[BIND_ENV] == "nobind"
