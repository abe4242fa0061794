"""Fair share between callers: what it buys and what it costs, in one run.

For each side (first come, first served: `--no-fair-share`; fair share: the
default) one server on the embedded model, and on it, one after the other:

- one caller: A sends 600 unary calls of 256 sampled tokens at once
  (`ignore_eos`); total output tokens per second;
- two callers: A and C send 300 each at once; total tokens per second;
- the noisy neighbour: B's 16-token greedy call idle (median of 5), then 3 s
  into A's 600 (the issue's scenario), then every 0.25 s until they end: B's
  latency percentiles over all of those, and the ratio of the 3 s one to B's
  idle latency.

Callers are tenants (`rollout-tenant` metadata, auth off). Printed too: the
server's CPU seconds (its process tree) per 1k output tokens, and the
fair/FCFS ratios of the throughputs. Run it with nothing else running:

    .venv/bin/python -m benchmarks.fair_share
    .venv/bin/python -m benchmarks.fair_share --flood 300 --rounds 2
    .venv/bin/python -m benchmarks.fair_share --seats 128 64   # more sides: fewer seats
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass, field

from benchmarks.loadgen import tree_cpu_seconds
from harness import noisy_neighbour as nn
from harness.serverproc import ServerProcess

SIDES = {"fcfs": ("--no-fair-share",), "fair": ()}


@dataclass
class Side:
    one_caller: list[float] = field(default_factory=list)  # tok/s
    two_callers: list[float] = field(default_factory=list)
    cpu_per_1k: list[float] = field(default_factory=list)  # server CPU s / 1k out tokens
    idle_ms: list[float] = field(default_factory=list)
    first_ms: list[float] = field(default_factory=list)  # B's call 3 s into the flood
    behind_ms: list[float] = field(default_factory=list)  # every call of B's during it
    lost: int = 0


async def _throughput(target: str, floods: dict[str, int], tokens: int, pid: int) -> tuple:
    clients = [nn.client(target, {"tenant": name}) for name in floods]
    try:
        cpu0 = sum(tree_cpu_seconds(pid))
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(nn.flood(c, n, tokens) for c, n in zip(clients, floods.values(), strict=True))
        )
        seconds = time.perf_counter() - t0
        cpu = sum(tree_cpu_seconds(pid)) - cpu0
    finally:
        for c in clients:
            await c.close()
    flat = [r for rs in results for r in rs]
    out = sum(r for r in flat if isinstance(r, int))
    lost = sum(isinstance(r, BaseException) for r in flat)
    return out / seconds, 1000 * cpu / max(1, out), lost


async def _neighbour(target: str, calls: int, tokens: int, side: Side) -> None:
    async with nn.client(target, {"tenant": "A"}) as a, nn.client(target, {"tenant": "B"}) as b:
        await nn.probe(b)
        side.idle_ms += [1000 * await nn.probe(b) for _ in range(5)]
        flooding = nn.flood(a, calls, tokens)
        await asyncio.sleep(3.0)
        side.first_ms.append(1000 * await nn.probe(b))
        while not flooding.done():
            side.behind_ms.append(1000 * await nn.probe(b))
            await asyncio.sleep(0.25)
        side.lost += sum(isinstance(r, BaseException) for r in await flooding)


def measure(name: str, flags: tuple[str, ...], args: argparse.Namespace) -> Side:
    side = Side()
    server = ServerProcess(*flags)
    try:
        server.wait_ready()
        for _ in range(args.rounds):
            for floods, into in (
                ({"A": args.flood}, side.one_caller),
                ({"A": args.flood // 2, "C": args.flood // 2}, side.two_callers),
            ):
                tps, cpu, lost = asyncio.run(
                    _throughput(server.target, floods, args.tokens, server.proc.pid)
                )
                into.append(tps)
                side.cpu_per_1k.append(cpu)
                side.lost += lost
            asyncio.run(_neighbour(server.target, args.flood, args.tokens, side))
            print(f"  {name}: round done", flush=True)
    finally:
        server.stop()
    return side


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flood", type=int, default=600, help="A's calls")
    p.add_argument("--tokens", type=int, default=256, help="tokens of each of A's calls")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument(
        "--seats", type=int, nargs="*", default=[], help="also fair share with these engine seats"
    )
    p.add_argument("--only-seats", action="store_true", help="only the --seats sides")
    args = p.parse_args()
    all_sides = dict(SIDES)
    for n in args.seats:
        all_sides[f"fair, {n} seats"] = ("--engine-seats-per-caller", str(n))
    if args.only_seats:
        all_sides = {k: v for k, v in all_sides.items() if k not in SIDES}
    sides = {name: measure(name, flags, args) for name, flags in all_sides.items()}
    mean = statistics.mean
    print(
        "\n| side | one caller tok/s | two callers tok/s | server CPU s / 1k tok "
        "| B idle ms | B 3 s into A's flood ms | / idle | B during the flood: p50 / p90 / max ms "
        "| lost |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, s in sides.items():
        idle = statistics.median(s.idle_ms)
        b = s.behind_ms
        print(
            f"| {name} | {mean(s.one_caller):,.0f} | {mean(s.two_callers):,.0f} "
            f"| {mean(s.cpu_per_1k):.3f} | {idle:.1f} | {mean(s.first_ms):.0f} "
            f"| {mean(s.first_ms) / idle:.1f}x "
            f"| {pct(b, 0.5):.0f} / {pct(b, 0.9):.0f} / {max(b):.0f} | {s.lost} |"
        )
    if args.only_seats:
        return
    fair, fcfs = sides["fair"], sides["fcfs"]
    one = mean(fair.one_caller) / mean(fcfs.one_caller)
    two = mean(fair.two_callers) / mean(fcfs.two_callers)
    print(f"\nfair / fcfs throughput: one caller {one:.3f}, two callers {two:.3f}")


if __name__ == "__main__":
    main()
