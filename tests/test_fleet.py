"""Two real replicas behind one Fleet: spread Generate, one update with a
version barrier, a replica killed between staging and commit."""

from __future__ import annotations

import signal
import threading

import pytest

from rollout_client import RolloutClient
from rollout_client.fleet import Fleet, FleetUpdateError, resolve
from tests.serverproc import running
from tests.weights_util import random_weights, version

PROMPT = list(range(7, 60))


@pytest.fixture(scope="module")
def replica2():
    with running() as proc:
        yield proc


@pytest.fixture(scope="module")
def fresh_output(replica2):
    """replica2 before any update: a fresh engine on the embedded checkpoint."""
    with RolloutClient(replica2.target) as c:
        return greedy(c)[1:]


@pytest.fixture(scope="module")
def fleet(server, replica2, fresh_output):
    with Fleet([server.target, replica2.target], timeout=120) as f:
        yield f


def greedy(client):
    r = client.generate(prompt_token_ids=PROMPT, max_tokens=12, temperature=0)
    return r.weight_version, list(r.completions[0].token_ids), list(r.completions[0].logprobs)


def test_a_dns_name_resolves_to_its_addresses():
    assert resolve("localhost:5000") in (
        ["127.0.0.1:5000"],
        ["127.0.0.1:5000", "[::1]:5000"],
        ["[::1]:5000", "127.0.0.1:5000"],
    )
    assert resolve(["a:1", "b:2"]) == ["a:1", "b:2"]


def test_one_update_reaches_every_replica_and_they_agree(fleet, info, server, replica2):
    v = version()
    ack = fleet.update_weights(random_weights(info.parameters, seed=3001), v)
    assert set(ack.acks) == {server.target, replica2.target} and not ack.dropped
    assert all(a.weight_version == v for a in ack.acks.values())
    with RolloutClient(server.target) as a, RolloutClient(replica2.target) as b:
        out_a, out_b = greedy(a), greedy(b)
    assert out_a == out_b and out_a[0] == v


def test_after_a_fleet_update_every_replica_equals_a_fresh_engine(
    fleet, info, server, replica2, fresh_output
):
    from safetensors.torch import load_file

    from rollout_service.tiny_models import ensure_model

    initial = {}
    for f in sorted(ensure_model("tiny-qwen2").glob("*.safetensors")):
        initial.update(load_file(f))
    fleet.update_weights(random_weights(info.parameters, seed=3003), version())
    fleet.update_weights(initial, version())
    for target in (server.target, replica2.target):
        with RolloutClient(target) as c:
            assert greedy(c)[1:] == fresh_output, target


def test_the_asyncio_fleet(server, replica2, info):
    import asyncio

    from rollout_client.fleet import AsyncFleet

    async def main():
        async with AsyncFleet([server.target, replica2.target], timeout=120) as f:
            v = version()
            ack = await f.update_weights(random_weights(info.parameters, seed=3004), v)
            rs = await asyncio.gather(
                *(f.generate(prompt_token_ids=[i, 2], max_tokens=4) for i in range(6))
            )
            return ack, rs, v

    ack, rs, v = asyncio.run(main())
    assert len(ack.acks) == 2 and {r.weight_version for r in rs} == {v}


def test_generate_is_spread_over_the_replicas(fleet):
    for r in fleet.replicas:
        r.served = 0
    threads = [
        threading.Thread(
            target=fleet.generate,
            kwargs=dict(prompt_token_ids=[i, 5, 6], max_tokens=64, ignore_eos=True),
        )
        for i in range(16)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    served = [r.served for r in fleet.replicas]
    assert sum(served) == 16 and min(served) >= 4, served


def test_prefix_affinity_keeps_a_prefix_on_one_replica(server, replica2):
    with Fleet([server.target, replica2.target], prefix_affinity_tokens=8) as f:
        for _ in range(6):
            f.generate(prompt_token_ids=PROMPT, max_tokens=2)
        assert sorted(r.served for r in f.replicas) == [0, 6]


def test_a_replica_killed_before_the_commit_aborts_the_update_everywhere(
    fleet, info, server, replica2
):
    fleet.refresh()  # other clients (the asyncio test) updated the replicas meanwhile
    before = fleet.version
    with RolloutClient(server.target) as a:
        out_before = greedy(a)
    assert out_before[0] == before

    def kill():
        replica2.proc.send_signal(signal.SIGKILL)
        replica2.proc.wait()

    with pytest.raises(FleetUpdateError) as e:
        fleet.update_weights(
            random_weights(info.parameters, seed=3002), version(), before_commit=kill
        )
    assert replica2.target in e.value.errors
    with RolloutClient(server.target) as a:
        assert greedy(a) == out_before, "the surviving replica kept the old version"
    assert fleet.version == before
    dead = [r for r in fleet.replicas if not r.alive]
    assert [r.target for r in dead] == [replica2.target]
    assert fleet.generate(prompt_token_ids=PROMPT, max_tokens=2).weight_version == before
