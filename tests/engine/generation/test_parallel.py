"""Tensor parallelism on this CPU machine (one worker per core, bound by the
server: rollout_service.engine.placement), and the parallel layouts refused at start."""

from __future__ import annotations

import os
import random

import psutil
import pytest

from harness.weights_util import random_weights, version
from rollout_client import RolloutClient
from rollout_service.engine.placement import BIND_ENV
from tests.support.cpus import thread_cpus
from tests.support.serve_command import Run, serve_each
from tests.support.tp2 import LAYOUTS

PROMPT = [random.Random(3).randrange(10, 500) for _ in range(200)]


def greedy(c):
    r = c.generate(prompt_token_ids=PROMPT, max_tokens=16, temperature=0)
    return r.weight_version, list(r.completions[0].token_ids), list(r.completions[0].logprobs)


@pytest.fixture(params=list(LAYOUTS))
def tp2(request, tp2_servers):
    return tp2_servers[request.param]


def _workers(server) -> list[psutil.Process]:
    workers = [
        p
        for p in psutil.Process(server.proc.pid).children(recursive=True)
        if "Worker" in p.name() or "Worker" in " ".join(p.cmdline())
    ]
    assert len(workers) == 2, workers
    return workers


def _mapped(worker: psutil.Process, marker: str) -> set[str]:
    """The paths the worker maps whose name holds `marker` ("... (deleted)"
    once unlinked)."""
    with open(f"/proc/{worker.pid}/maps") as f:
        return {line.split(maxsplit=5)[-1].rstrip() for line in f if marker in line}


def _workers_mapping_the_region(server) -> int:
    return sum(bool(_mapped(w, "rollout-staging-")) for w in _workers(server))


def test_a_tp2_replicas_workers_compute_on_cores_of_their_own(tp2):
    first, second = (thread_cpus(w) for w in _workers(tp2))
    assert first and second and not first & second, (first, second)
    assert first | second <= os.sched_getaffinity(0)


def test_a_tp2_replica_updates_and_returns_exactly_to_a_fresh_engines_output(tp2):
    with RolloutClient(tp2.target, timeout=300) as c:
        info = c.server_info()
        fresh = greedy(c)[1:]  # the engine as started, on the embedded checkpoint
        from safetensors.torch import load_file

        from rollout_service.engine.tiny_models import ensure_model

        initial = {}
        for f in sorted(ensure_model("tiny-qwen2").glob("*.safetensors")):
            initial.update(load_file(f))
        v = version()
        c.update_weights(random_weights(info.parameters, seed=4001), v)
        changed = greedy(c)
        assert changed[0] == v and changed[1:] != fresh
        # The starting weights again, through the update path: exactly the fresh engine.
        c.update_weights(initial, version())
        assert greedy(c)[1:] == fresh
    # With --weight-broadcast only the first rank reads the region: the
    # second got every byte over the engine's process group.
    assert _workers_mapping_the_region(tp2) == (1 if tp2.broadcast else 2)


def test_a_tp2_replica_leaves_no_shared_memory_behind(tp2):
    """Each rank of vLLM's CPU communicator maps every rank's segment, and
    none is left under a name in /dev/shm once they serve: a stop or a kill
    leaves nothing there (each TP=2 server used to leave two 4 MiB segments,
    host memory until a reboot)."""
    for worker in _workers(tp2):
        mapped = _mapped(worker, "-cpushm_")
        assert len(mapped) == 2, mapped  # its own and the other rank's
        assert all(path.endswith(" (deleted)") for path in mapped), mapped


REFUSED_LAYOUTS = [
    (("--pipeline-parallel-size", "2"), "--pipeline-parallel-size"),
    (("--data-parallel-size", "2"), "Fleet"),
    # Not just "staging region": every start logs "staging region ...: N bytes reserved".
    (("--distributed-executor-backend", "ray"), "this host's staging region"),
]
ONE_CPU = "tp2 on one CPU"


@pytest.fixture(scope="module")
def refused():
    """This module's refused starts run to their end, vLLM imported once for
    all of them (tests/support/serve_command.py)."""
    runs = {" ".join(flags): Run(flags) for flags, _ in REFUSED_LAYOUTS}
    # One CPU, and the variable unset (the server would otherwise leave the binding to it).
    runs[ONE_CPU] = Run(
        ("--tensor-parallel-size", "2"),
        unset=(BIND_ENV,),
        cpus=frozenset({min(os.sched_getaffinity(0))}),
    )
    return serve_each(runs)


@pytest.mark.parametrize(("flags", "needle"), REFUSED_LAYOUTS)
def test_untested_parallel_layouts_are_refused_at_start(refused, flags, needle):
    p = refused[" ".join(flags)]
    assert p.returncode != 0 and needle in p.stderr, p.stderr[-2000:]


def test_tp2_with_one_cpu_is_refused_naming_the_variable(refused):
    p = refused[ONE_CPU]
    # Refused before any engine starts, with what to do instead of a traceback.
    assert p.returncode == 1, p.stderr[-2000:]
    assert "cannot start" in p.stderr and BIND_ENV in p.stderr, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and "EngineCore" not in p.stderr, p.stderr[-2000:]
