"""Fair share between callers: what it buys and what it costs, in one run.

For each side (first come, first served: `--no-fair-share`; fair share: the
default) one server on the embedded model, and on it, one after the other:

- one caller: A sends 600 unary calls of 256 sampled tokens at once
  (`ignore_eos`); total output tokens per second;
- two callers: A and C send 300 each at once; total tokens per second;
- the noisy neighbour: B's 16-token greedy call idle (median of 5), then 3 s
  into A's 600 (the issue's scenario), then every 0.25 s until they end: B's
  latency percentiles over all of those, and the ratio of the 3 s one to B's
  idle latency. This is what fair share promises for unary calls;
- the same neighbour behind each of A's floods (`--floods`, default all of
  harness/noisy_neighbour.FLOODS: unary Generate, GenerateStream, GenerateMany
  on one stream, a streamed turn on each of 600 sessions): B's GetServerInfo
  sent 5 ms after A's flood (as A's calls arrive), B's probes idle (medians
  of 5), 3 s into the flood, then in turn until it ends: its unary
  call, its first streamed token, GetServerInfo, and (3 s in and idle) an
  Abort of a stream of its own after 32 tokens (how long the Abort took, the
  tokens the stream still sent after it returned, the ms from sending it to
  the stream's end). Ratios are each probe's over its idle median in the
  same round, so a busy host moves both sides of them.

Callers are tenants (`rollout-tenant` metadata, auth off). Printed too: the
server's CPU seconds (its process tree) per 1k output tokens, the fair/FCFS
ratios of the throughputs, and the host's load average (`uptime`) when each
side starts and ends. Run it with nothing else running:

    .venv/bin/python -m benchmarks.fair_share
    .venv/bin/python -m benchmarks.fair_share --flood 300 --rounds 2
    .venv/bin/python -m benchmarks.fair_share --seats 128 64   # more sides: fewer seats
    .venv/bin/python -m benchmarks.fair_share --sides fair --no-throughput   # floods only
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from dataclasses import dataclass, field

from benchmarks.lib.loadgen import tree_cpu_seconds
from harness import noisy_neighbour as nn
from harness.serverproc import ServerProcess

SIDES = {"fcfs": ("--no-fair-share",), "fair": ()}


@dataclass
class Probes:
    """B's probes in one state of the server (idle, or behind a flood), ms."""

    unary: list[float] = field(default_factory=list)
    first_token: list[float] = field(default_factory=list)
    info: list[float] = field(default_factory=list)
    aborts: list[nn.Lateness] = field(default_factory=list)


@dataclass
class Flood:
    """B behind one kind of A's flood, over the rounds."""

    arrival_info: list[float] = field(default_factory=list)  # GetServerInfo 5 ms in, ms
    at_3s: Probes = field(default_factory=Probes)
    during: Probes = field(default_factory=Probes)
    ratios: dict[str, list[float]] = field(default_factory=dict)  # probe: 3 s in / idle
    tok_s: list[float] = field(default_factory=list)  # A's flood's output tokens per second
    lost: int = 0


@dataclass
class Side:
    one_caller: list[float] = field(default_factory=list)  # tok/s
    two_callers: list[float] = field(default_factory=list)
    cpu_per_1k: list[float] = field(default_factory=list)  # server CPU s / 1k out tokens
    idle_ms: list[float] = field(default_factory=list)
    first_ms: list[float] = field(default_factory=list)  # B's call 3 s into the flood
    behind_ms: list[float] = field(default_factory=list)  # every call of B's during it
    lost: int = 0
    idle: Probes = field(default_factory=Probes)
    floods: dict[str, Flood] = field(default_factory=dict)
    load: list[str] = field(default_factory=list)  # load averages at its start and end


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


async def _probe_all(b, into: Probes, abort: bool) -> None:
    into.unary.append(1000 * await nn.probe(b))
    into.first_token.append(1000 * await nn.first_token(b))
    into.info.append(1000 * await nn.server_info(b))
    if abort:
        into.aborts.append(await nn.abort_lateness(b))


async def _floods(target: str, args: argparse.Namespace, side: Side) -> None:
    """B's probes idle, then behind each of A's `args.floods` in turn."""
    async with nn.client(target, {"tenant": "A"}) as a, nn.client(target, {"tenant": "B"}) as b:
        await _probe_all(b, Probes(), abort=True)  # warm
        idle = Probes()
        for _ in range(5):
            await _probe_all(b, idle, abort=len(idle.aborts) < 2)
        for name, values in vars(idle).items():
            getattr(side.idle, name).extend(values)
        for kind in args.floods:
            f = side.floods.setdefault(kind, Flood())
            t0 = time.perf_counter()
            flooding = nn.flood(a, args.flood, args.tokens, kind=kind)
            await asyncio.sleep(0.005)  # as A's calls arrive
            f.arrival_info.append(1000 * await nn.server_info(b))
            await asyncio.sleep(max(0.0, 3.0 - (time.perf_counter() - t0)))
            at = Probes()
            await _probe_all(b, at, abort=True)
            for probe in ("unary", "first_token", "info"):
                ratio = getattr(at, probe)[0] / statistics.median(getattr(idle, probe))
                f.ratios.setdefault(probe, []).append(ratio)
                getattr(f.at_3s, probe).extend(getattr(at, probe))
            f.at_3s.aborts += at.aborts
            while not flooding.done():
                await _probe_all(b, f.during, abort=False)
                await asyncio.sleep(0.25)
            results = await flooding
            f.tok_s.append(
                sum(r for r in results if isinstance(r, int)) / (time.perf_counter() - t0)
            )
            f.lost += sum(isinstance(r, BaseException) for r in results)


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def measure(name: str, flags: tuple[str, ...], args: argparse.Namespace) -> Side:
    side = Side()
    server = ServerProcess(*flags)
    try:
        server.wait_ready()
        side.load.append(_load())
        for _ in range(args.rounds):
            if args.throughput:
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
            if args.floods:
                asyncio.run(_floods(server.target, args, side))
            print(f"  {name}: round done, load {_load()}", flush=True)
        side.load.append(_load())
    finally:
        server.stop()
    return side


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _spread(values: list[float]) -> str:
    return f"{pct(values, 0.5):.0f} / {pct(values, 0.9):.0f} / {max(values):.0f}"


def _print_throughput(sides: dict[str, Side]) -> None:
    mean = statistics.mean
    print(
        "\n| side | one caller tok/s | two callers tok/s | server CPU s / 1k tok "
        "| B idle ms | B 3 s into A's flood ms | / idle | B during the flood: p50 / p90 / max ms "
        "| lost |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, s in sides.items():
        idle = statistics.median(s.idle_ms)
        print(
            f"| {name} | {mean(s.one_caller):,.0f} | {mean(s.two_callers):,.0f} "
            f"| {mean(s.cpu_per_1k):.3f} | {idle:.1f} | {mean(s.first_ms):.0f} "
            f"| {mean(s.first_ms) / idle:.1f}x | {_spread(s.behind_ms)} | {s.lost} |"
        )


def _print_floods(sides: dict[str, Side]) -> None:
    mean = statistics.mean
    print(
        "\nB behind each of A's floods: 3 s in, ms (/ B's idle median), and while it ran"
        "\n\n| side | A's flood | A tok/s | B unary call | B first token | during: p50 / p90 / max "
        "| GetServerInfo | during: p50 / p90 / max | as the flood arrives | Abort ms "
        "| tokens after it returned | ms to the stream's end | lost |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, s in sides.items():
        idle = s.idle
        abort = _aborts(idle.aborts)
        print(
            f"| {name} | (idle) | | {statistics.median(idle.unary):.1f} "
            f"| {statistics.median(idle.first_token):.1f} | | {statistics.median(idle.info):.1f} "
            f"| | | {abort} | |"
        )
        for kind, f in s.floods.items():
            at, during, r = f.at_3s, f.during, f.ratios
            print(
                f"| {name} | {kind} | {mean(f.tok_s):,.0f} "
                f"| {mean(at.unary):.0f} ({mean(r['unary']):.1f}x) "
                f"| {mean(at.first_token):.0f} ({mean(r['first_token']):.1f}x) "
                f"| {_spread(during.first_token) if during.first_token else '-'} "
                f"| {mean(at.info):.0f} ({mean(r['info']):.1f}x) "
                f"| {_spread(during.info) if during.info else '-'} "
                f"| {mean(f.arrival_info):.0f} | {_aborts(at.aborts)} | {f.lost} |"
            )


def _aborts(aborts: list[nn.Lateness]) -> str:
    mean = statistics.mean
    return (
        f"{mean(x.abort_seconds for x in aborts) * 1000:.1f} "
        f"| {max(x.tokens_after_return for x in aborts)} "
        f"| {mean(x.end_seconds for x in aborts) * 1000:.0f}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flood", type=int, default=600, help="A's calls")
    p.add_argument("--tokens", type=int, default=256, help="tokens of each of A's calls")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument(
        "--seats", type=int, nargs="*", default=[], help="also fair share with these engine seats"
    )
    p.add_argument("--only-seats", action="store_true", help="only the --seats sides")
    p.add_argument("--sides", nargs="*", choices=list(SIDES), default=list(SIDES))
    p.add_argument(
        "--floods", nargs="*", choices=nn.FLOODS, default=list(nn.FLOODS),
        help="A's floods B's probes run behind (none: only the unary reference)",
    )  # fmt: skip
    p.add_argument(
        "--no-throughput", dest="throughput", action="store_false",
        help="skip the throughputs and the unary reference",
    )  # fmt: skip
    args = p.parse_args()
    all_sides = {k: v for k, v in SIDES.items() if k in args.sides}
    for n in args.seats:
        all_sides[f"fair, {n} seats"] = ("--engine-seats-per-caller", str(n))
    if args.only_seats:
        all_sides = {k: v for k, v in all_sides.items() if k not in SIDES}
    print(f"load average (1/5/15 min) at the start: {_load()}", flush=True)
    sides = {name: measure(name, flags, args) for name, flags in all_sides.items()}
    for name, s in sides.items():
        print(f"{name}: load average at its start {s.load[0]}, at its end {s.load[-1]}")
    if args.throughput:
        _print_throughput(sides)
    if args.floods:
        _print_floods(sides)
    if args.only_seats or not args.throughput or set(SIDES) - set(sides):
        return
    fair, fcfs = sides["fair"], sides["fcfs"]
    one = statistics.mean(fair.one_caller) / statistics.mean(fcfs.one_caller)
    two = statistics.mean(fair.two_callers) / statistics.mean(fcfs.two_callers)
    print(f"\nfair / fcfs throughput: one caller {one:.3f}, two callers {two:.3f}")


if __name__ == "__main__":
    main()
