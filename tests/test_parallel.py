"""Tensor parallelism on this CPU machine (one worker per core), and the
parallel layouts refused at start."""

from __future__ import annotations

import random

import psutil
import pytest

from rollout_client import RolloutClient
from tests.serverproc import running
from tests.test_engine_config import serve
from tests.weights_util import random_weights, version

PROMPT = [random.Random(3).randrange(10, 500) for _ in range(200)]


def greedy(c):
    r = c.generate(prompt_token_ids=PROMPT, max_tokens=16, temperature=0)
    return r.weight_version, list(r.completions[0].token_ids), list(r.completions[0].logprobs)


@pytest.fixture(scope="module", params=["every rank reads", "rank 0 broadcasts"])
def tp2(request):
    # Two CPU workers need a core each, bound by hand on 2 cores (see the CPU notes).
    extra = ["--weight-broadcast"] if request.param == "rank 0 broadcasts" else []
    flags = ("--tensor-parallel-size", "2", *extra)
    with running(*flags, env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"}) as proc:
        proc.broadcast = bool(extra)
        yield proc


def _workers_mapping_the_region(server) -> int:
    workers = [
        p
        for p in psutil.Process(server.proc.pid).children(recursive=True)
        if "Worker" in p.name() or "Worker" in " ".join(p.cmdline())
    ]
    assert len(workers) == 2, workers
    return sum("rollout-staging-" in open(f"/proc/{w.pid}/maps").read() for w in workers)


def test_a_tp2_replica_updates_and_returns_exactly_to_a_fresh_engines_output(tp2):
    with RolloutClient(tp2.target, timeout=300) as c:
        info = c.server_info()
        fresh = greedy(c)[1:]  # the engine as started, on the embedded checkpoint
        from safetensors.torch import load_file

        from rollout_service.tiny_models import ensure_model

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


@pytest.mark.parametrize(
    "flags, needle",
    [
        (("--pipeline-parallel-size", "2"), "--pipeline-parallel-size"),
        (("--data-parallel-size", "2"), "Fleet"),
        (("--distributed-executor-backend", "ray"), "staging region"),
    ],
)
def test_untested_parallel_layouts_are_refused_at_start(flags, needle):
    p = serve(*flags)
    assert p.returncode != 0 and needle in p.stderr, p.stderr[-2000:]
