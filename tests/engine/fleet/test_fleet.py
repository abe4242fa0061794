"""Two real replicas behind one Fleet: spread Generate, one update with a
version barrier, a replica killed between staging and commit, and a replica
that comes back on its initial weights (behind the fleet's back, or
restarted at its address as Kubernetes restarts a pod): it never serves a
rollout, and is healed and serving again within a bound."""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness.serverproc import ServerProcess
from harness.weights_util import random_weights, version
from rollout_client import RolloutClient, RolloutError
from rollout_client.fleet import Fleet, FleetUpdateError, resolve

PROMPT = list(range(7, 60))
# Longer than a KV block (128 tokens on CPU): the prefix cache holds whole blocks.
USER = [{"role": "user", "content": "What is 2+2? Use the calculator, then answer. " * 16}]
TOOL = [{"role": "tool", "content": '{"result": 4}'}]


class Restartable:
    """replica2's server; `restart()` starts it again at the same address
    on its initial weights, as Kubernetes restarts a pod after an OOM kill."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server  # started and ready (conftest's own_server)

    def _wait_ready(self) -> None:
        try:
            self.server.wait_ready()
        except BaseException:
            self.server.stop()
            raise

    @property
    def target(self) -> str:
        return self.server.target

    @property
    def proc(self):
        return self.server.proc

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.server.stop()

    def restart(self) -> None:
        self.server = ServerProcess(port=self.server.port)
        self._wait_ready()


@pytest.fixture(scope="module")
def replica2(own_server):
    r = Restartable(own_server)
    try:
        yield r
    finally:
        r.server.stop(wait=False)


@pytest.fixture(scope="module")
def fresh_output(replica2):
    """replica2 before any update: a fresh engine on the embedded checkpoint."""
    with RolloutClient(replica2.target) as c:
        return greedy(c)[1:]


@pytest.fixture
def fleet(server, replica2, fresh_output):
    with Fleet([server.target, replica2.target], timeout=120) as f:
        yield f


@pytest.fixture(scope="module")
def initial_checkpoint():
    from rollout_service.engine.tiny_models import ensure_model

    return str(ensure_model("tiny-qwen2"))


@pytest.fixture
def checkpoint(info, tmp_path):
    """A new version's weights as a file, as a trainer writes them."""
    from safetensors.torch import save_file

    path = tmp_path / "step.safetensors"
    save_file(random_weights(info.parameters, seed=3010), path)
    return str(path)


def greedy(client):
    r = client.generate(prompt_token_ids=PROMPT, max_tokens=12, temperature=0)
    return r.weight_version, list(r.completions[0].token_ids), list(r.completions[0].logprobs)


def concurrently(fleet, n: int) -> list:
    """`n` fleet.generate calls at once (the trainer's batch of rollouts)."""
    with ThreadPoolExecutor(n) as pool:
        calls = [
            pool.submit(fleet.generate, prompt_token_ids=[i, *PROMPT], max_tokens=8)
            for i in range(n)
        ]
        return [c.result() for c in calls]


def eventually(condition, seconds: float, what: str) -> float:
    """Waits for `condition()`; the seconds it took."""
    t0 = time.monotonic()
    while not condition():
        assert time.monotonic() - t0 < seconds, f"not within {seconds} s: {what}"
        time.sleep(0.1)
    return time.monotonic() - t0


def served_by(fleet, calls: int) -> list[int]:
    """How many of `calls` sequential calls each replica served."""
    for r in fleet.replicas:
        r.served = 0
    for _ in range(calls):
        fleet.generate(prompt_token_ids=PROMPT, max_tokens=2)
    return [r.served for r in fleet.replicas]


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

    from rollout_service.engine.tiny_models import ensure_model

    initial = {}
    for f in sorted(ensure_model("tiny-qwen2").glob("*.safetensors")):
        initial.update(load_file(f))
    fleet.update_weights(random_weights(info.parameters, seed=3003), version())
    fleet.update_weights(initial, version())
    for target in (server.target, replica2.target):
        with RolloutClient(target) as c:
            assert greedy(c)[1:] == fresh_output, target


def test_one_delta_reaches_both_replicas_on_the_same_base(fleet, info, server, replica2):
    weights = random_weights(info.parameters, seed=3020)
    first = fleet.update_weights(weights, version(), delta=True)  # no record yet: in full
    assert all(a.timings.decode_seconds == 0 for a in first.acks.values())
    nudged = {n: t.clone() for n, t in weights.items()}
    nudged["lm_head.weight"][:4] += 0.25  # a few rows change
    v = version()
    ack = fleet.update_weights(nudged, v, delta=True)
    assert set(ack.acks) == {server.target, replica2.target} and not ack.dropped
    full = first.acks[server.target].bytes_received
    for a in ack.acks.values():
        assert a.weight_version == v and a.timings.decode_seconds > 0
        assert a.bytes_received < full / 50, "only the changed words travelled"
    with RolloutClient(server.target) as a, RolloutClient(replica2.target) as b:
        out_a, out_b = greedy(a), greedy(b)
        assert a.server_info().delta_base_version == b.server_info().delta_base_version == v
    # The same weights pushed in full to one replica serve the same.
    with RolloutClient(replica2.target) as c:
        c.update_weights(nudged, version())
        assert greedy(c)[1:] == out_a[1:] == out_b[1:]


def test_a_delta_no_replica_commits_leaves_the_fleets_copy_on_its_base(server, info, monkeypatch):
    # The fleet applies a delta to its copy while it stages it; when no
    # replica commits, the copy must be the base again, or the next delta
    # (against the base every replica still holds) would encode the wrong
    # bytes.
    from rollout_client.fleet import staging

    def nudged(weights, rows: slice):
        out = {n: t.clone() for n, t in weights.items()}
        out["lm_head.weight"][rows] += 0.25
        return out

    def refused(replicas, opened, timeout):
        for r in replicas:
            staging.abort(r, opened[r.target])
        return {}, {r.target: "the commit was refused (a test)" for r in replicas}

    with Fleet([server.target], timeout=120) as fleet:
        base = random_weights(info.parameters, seed=3021)
        v1 = version()
        fleet.update_weights(base, v1, delta="always")  # no copy yet: in full
        with monkeypatch.context() as m:
            m.setattr(staging, "commit_all", refused)
            ack = fleet.update_weights(nudged(base, slice(0, 4)), version(), delta="always")
        assert not ack.acks and fleet.pushed is not None and fleet.pushed.version == v1
        fleet.check()  # the replica the failed commit dropped answers again
        third = nudged(base, slice(4, 8))
        ack = fleet.update_weights(third, version(), delta="always")
        assert set(ack.acks) == {server.target}, ack.dropped  # a wrong base fails its CRC
        a = ack.acks[server.target]
        assert a.previous_weight_version == v1 and a.timings.decode_seconds > 0
        with RolloutClient(server.target) as c:
            out = greedy(c)
            c.update_weights(third, version())  # the same bytes in full
            assert greedy(c)[1:] == out[1:]


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


def test_one_client_can_require_a_version(client):
    """The keyword the fleet relies on, for single-replica users too."""
    served = client.server_info().weight_version
    r = client.generate(prompt_token_ids=PROMPT, max_tokens=2, required_weight_version=served)
    assert r.weight_version == served
    for call in (client.generate, lambda **kw: list(client.generate_stream(**kw))):
        with pytest.raises(RolloutError) as e:
            call(prompt_token_ids=PROMPT, max_tokens=2, required_weight_version="not-served")
        assert e.value.reason == "WRONG_WEIGHT_VERSION", e.value


def test_sequential_calls_go_round_the_replicas(server, replica2, checkpoint):
    with Fleet([server.target, replica2.target], timeout=120) as f:
        f.update_weights(checkpoint, version())
        assert served_by(f, 6) == [3, 3]


def test_a_replica_back_on_its_initial_weights_never_serves_and_is_healed(
    server, replica2, checkpoint, initial_checkpoint
):
    """The fleet's view is stale (no probe in this test: only the refusal at
    admission can tell): 16 rollouts, none from the old weights."""
    v1 = version()
    with Fleet([server.target, replica2.target], timeout=120, probe_seconds=3600) as f:
        assert set(f.update_weights(checkpoint, v1).acks) == {server.target, replica2.target}
        with RolloutClient(replica2.target) as b:  # what a restarted pod serves
            b.update_weights(initial_checkpoint, "initial")
        assert {r.weight_version for r in concurrently(f, 16)} == {v1}
        took = eventually(lambda: f.status()[replica2.target] == f"serving {v1}", 30, "healed")
        print(f"healed {took:.2f} s after the rollouts")
        with RolloutClient(replica2.target) as b:
            assert b.server_info().weight_version == v1
        assert served_by(f, 4) == [2, 2]


def test_a_source_changed_in_place_does_not_heal(server, replica2, info, initial_checkpoint):
    """A trainer that pushed its live tensors and trained on: they no longer
    hold v1, so a heal from them would install other weights as v1."""
    weights = random_weights(info.parameters, seed=3011)
    with Fleet([server.target, replica2.target], timeout=120, probe_seconds=3600) as f:
        f.update_weights(weights, version())
        weights["lm_head.weight"].add_(0.5)  # the next optimizer step, in place
        with RolloutClient(replica2.target) as b:
            b.update_weights(initial_checkpoint, "initial")
        assert {r.weight_version for r in concurrently(f, 4)} == {f.version}
        eventually(lambda: "changed since it was pushed" in f.status()[replica2.target], 30, "why")
        with RolloutClient(replica2.target) as b:
            assert b.server_info().weight_version == "initial", "the heal was not committed"
        v2 = version()
        f.update_weights(weights, v2)  # a full update takes it back
        assert f.status()[replica2.target] == f"serving {v2}"


def test_sessions_are_balanced_and_each_call_goes_to_the_replica_holding_it(fleet):
    fleet.refresh()  # other tests updated the replicas meanwhile
    sessions = [fleet.open_session(messages=USER) for _ in range(4)]
    assert [r.sessions for r in fleet.replicas] == [2, 2]
    for s in sessions:
        s.generate(max_tokens=6, temperature=0)
        s.append(messages=TOOL)
        second = s.generate(max_tokens=6, temperature=0)
        # the history came from that replica's prefix cache (a full block)
        assert second.usage.cached_prompt_tokens > 0
        with RolloutClient(s.replica.target) as c:
            held = c.session(s.id).trajectory()
        # the fleet's copy, kept by reading only what each call added
        assert s.trajectory() == held and not s.moves
        assert [g.source for g in held.segments] == [1, 3, 2, 3, 3, 2]
    for s in sessions:
        s.close()
    assert [r.sessions for r in fleet.replicas] == [0, 0]


def on(fleet: Fleet, replica, **kwargs):
    """A fleet session placed on `replica` (others opened on the way closed)."""
    others = []
    while (s := fleet.open_session(messages=USER, **kwargs)).replica is not replica:
        others.append(s)
    for o in others:
        o.close()
    return s


def agent_steps(s) -> None:
    """What an agent loop does after a session's first turn."""
    s.append(messages=TOOL)
    s.generate(max_tokens=6, temperature=0)


def test_a_restarted_replica_is_dropped_probed_again_and_healed(server, replica2, checkpoint, info):
    """The issue's scenario with a real restart: the keeper drops the dead
    replica with no call to tell it, probes it again, heals it once it is
    back on its initial weights, and only then routes to it. The sessions
    it held move: re-opened elsewhere from the fleet's copy, they go on
    exactly as if never moved; one opened with move=False fails SESSION_LOST,
    and a pinned one keeps its pin."""
    v1 = version()
    with Fleet([server.target, replica2.target], timeout=120) as f:
        assert set(f.update_weights(checkpoint, v1).acks) == {server.target, replica2.target}
        a, b = f.replicas
        moved, kept, pinned = on(f, b), on(f, b, move=False), on(f, b, pin_weight_version=True)
        with RolloutClient(server.target) as c:  # the same steps, never moved
            reference = c.open_session(messages=USER)
            reference.generate(max_tokens=6, temperature=0)
            agent_steps(reference)
            expected = reference.trajectory()
        for s in (moved, kept, pinned):
            s.generate(max_tokens=6, temperature=0)
        before = len(moved.trajectory().token_ids)
        replica2.kill()
        agent_steps(moved)  # UNAVAILABLE: re-opened on a
        assert moved.replica is a and "UNAVAILABLE" in moved.moves[0][2], moved.moves
        with RolloutClient(server.target) as c:
            held = c.session(moved.id).trajectory()
        assert held == moved.trajectory() and held.resumed_tokens == before
        assert list(held.token_ids) == list(expected.token_ids)
        assert list(held.sources) == list(expected.sources)
        assert {v.weight_version for v in held.version_spans} == {v1}
        took = eventually(lambda: not b.alive, 15, "dropped by the keeper")
        print(f"dropped {took:.2f} s after the kill")
        assert {r.weight_version for r in concurrently(f, 4)} == {v1}
        old_id = kept.id
        replica2.restart()
        ready = time.monotonic()
        assert {r.weight_version for r in concurrently(f, 16)} == {v1}
        eventually(lambda: b.alive and b.version == v1, 30, "back on v1")
        print(f"serving {v1} again {time.monotonic() - ready:.2f} s after the restart")
        assert served_by(f, 4) == [2, 2]
        with pytest.raises(RolloutError) as e:  # move=False: the restart is the answer
            kept.generate(max_tokens=2)
        assert e.value.reason == "SESSION_LOST" and old_id in str(e.value), e.value
        with RolloutClient(replica2.target) as c:
            with pytest.raises(RolloutError) as e:
                c.session(old_id).trajectory()
            assert e.value.reason == "SESSION_LOST" and "restarted" in str(e.value)
        agent_steps(pinned)  # SESSION_LOST: moved, and still pinned to v1
        assert pinned.moves and pinned.trajectory().pinned_weight_version == v1
        f.update_weights(random_weights(info.parameters, seed=3030), version())
        with pytest.raises(RolloutError) as e:
            pinned.generate(max_tokens=2)
        assert e.value.reason == "WRONG_WEIGHT_VERSION" and len(pinned.moves) == 1


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
