"""Multi-turn trajectories on two replicas behind a Fleet: sessions held by
one replica against the whole history re-sent to the least-loaded one.

The workload is benchmarks.sessions' (the same seeded plan: `--sessions`
trajectories of `--turns` turns, all at once). Two replicas (two servers on
the embedded model, started here, or `--targets`); one thread per trajectory
(Fleet is sync; AsyncFleet runs each call through asyncio.to_thread, whose
default pool of min(32, CPUs + 4) threads would cap the concurrency). Two
ways, one after the other, caches reset before each:

- sessions: Fleet.open_session (placed on the replica with the fewest
  sessions), then its generate and append per turn, all on that replica;
- ids: Fleet.generate with the whole history as prompt_token_ids each turn,
  each call sent to the replica with the fewest calls outstanding, wherever
  the trajectory's history is cached.

Printed per way: wall time, output tokens per second, the prompt tokens
served from the prefix cache as a share of each turn's history (turns after
the first) beside the most the cache could serve (sessions.reusable), and
how the work spread: trajectories per replica (sessions), calls per replica
(ids). Two replicas on one 2-core host share its cores (both vLLM workers
bind core 0 by default): the throughput is not two hosts'.

    .venv/bin/python -m benchmarks.sessions_fleet          # starts two servers
    .venv/bin/python -m benchmarks.sessions_fleet --targets 127.0.0.1:50051,127.0.0.1:50052
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from benchmarks.sessions import Plan, Tally, plans, sampling, server_flags, workload_args
from harness.serverproc import ServerProcess
from rollout_client import RolloutClient, pb
from rollout_client.fleet import Fleet

Way = Callable[[Fleet, Plan, Tally], str]


def by_session(fleet: Fleet, p: Plan, tally: Tally) -> str:
    """The trajectory as a fleet session; returns the replica that held it."""
    before = None
    with fleet.open_session(prompt_token_ids=p.prompt) as s:
        for i, (n, env) in enumerate(zip(p.turns, p.env)):
            turn = s.generate(**sampling(n))
            tally.turn(turn.usage, before)
            before = turn.usage
            if i + 1 < len(p.turns):
                s.append(token_ids=env)
        return s.replica.target


def by_ids(fleet: Fleet, p: Plan, tally: Tally) -> str:
    """The trajectory re-sent each turn, wherever the fleet sends each call."""
    before = None
    history: list[int] = list(p.prompt)
    for n, env in zip(p.turns, p.env):
        r: pb.GenerateResponse = fleet.generate(prompt_token_ids=history, **sampling(n))
        tally.turn(r.usage, before)
        before = r.usage
        history += list(r.completions[0].token_ids) + env
    return ""


def run_way(
    targets: list[str], way: Way, work: list[Plan], block: int
) -> tuple[str, float, Tally, str]:
    """One way over the whole plan on a fresh Fleet: (way, seconds, tally, spread)."""
    for target in targets:
        with RolloutClient(target, timeout=600) as c:
            c.reset_caches()
    with Fleet(targets, timeout=600, probe_seconds=None) as fleet:
        fleet.refresh()
        served = {r.target: r.served for r in fleet.replicas}
        tallies = [Tally(block=block) for _ in work]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(len(work)) as pool:
            held = collections.Counter(pool.map(lambda p, t: way(fleet, p, t), work, tallies))
        seconds = time.perf_counter() - t0
        tally = Tally(block=block)
        for t in tallies:
            tally.add(t)
        if way is by_session:
            spread = " / ".join(f"{held[target]} trajectories" for target in targets)
        else:
            spread = " / ".join(f"{r.served - served[r.target]} calls" for r in fleet.replicas)
    return way.__name__.removeprefix("by_"), seconds, tally, spread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", help="two or more running servers, comma-separated")
    workload_args(parser)
    args = parser.parse_args()
    flags = server_flags(args.block_size)
    servers = [] if args.targets else [ServerProcess(*flags), ServerProcess(*flags)]
    try:
        for s in servers:
            s.wait_ready()
        targets = args.targets.split(",") if args.targets else [s.target for s in servers]
        with RolloutClient(targets[0], timeout=600) as c:
            c.wait_until_ready()
            vocab = c.server_info().vocab_size
        work = plans(args.sessions, args.turns, vocab, args.seed)
        results = [run_way(targets, w, work, args.block_size) for w in (by_session, by_ids)]
    finally:
        for s in servers:
            s.stop()
    n = len(targets)
    print(f"{args.sessions} trajectories x {args.turns} turns, all at once, {n} replicas")
    print(
        f"{'way':8} {'seconds':>8} {'out tok/s':>10} {'cached share':>12} "
        f"{'block ceiling':>13}  spread over replicas"
    )
    for way, seconds, t, spread in results:
        print(
            f"{way:8} {seconds:8.2f} {t.output / seconds:10.0f} {t.cached / t.history:12.3f} "
            f"{t.ceiling / t.history:13.3f}  {spread}"
        )


if __name__ == "__main__":
    main()
