"""Multi-turn trajectories on one server: sessions against the way users drive
them today, in one run.

The workload: `--sessions` trajectories of `--turns` model turns each, all at
once. Each turn samples a skewed length (most short, a few long: lognormal,
8 to 128 tokens, `ignore_eos`), and the environment answers with 20 to 200
tokens between turns (the whole fits the embedded model's 2048-token context).
One seeded plan of lengths and environment outputs drives, one after the other
on the same server:

- sessions: OpenSession, then SessionGenerate and AppendToSession per turn;
- ids: Generate with the whole history re-sent as prompt_token_ids each turn
  (what a client that keeps token ids does);
- text: Generate with the whole history re-sent as prompt_text each turn (what
  a client that keeps text does; its ids drift from what was sampled).

Printed per way: wall time, output tokens per second, the server's CPU
seconds per 1k output tokens (its process tree, from /proc), and the prompt
tokens served from the prefix cache as a share of each turn's history (turns
after the first), beside the most the cache could serve (`reusable`): whole
KV blocks (128 tokens on CPU) of what the engine computed for the
trajectory's previous turn. The environment's tokens since were never
computed, so they are never a hit. For text the ceiling assumes the
re-encoded history kept the ids, which it need not.

benchmarks/sessions_fleet.py drives the same plan through a Fleet of two.

    .venv/bin/python -m benchmarks.sessions               # starts its own server
    .venv/bin/python -m benchmarks.sessions --target 127.0.0.1:50051
    .venv/bin/python -m benchmarks.sessions --block-size 32   # smaller KV blocks
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from dataclasses import dataclass, field

from benchmarks.lib.loadgen import tree_cpu_seconds
from harness.serverproc import ServerProcess
from rollout_client import AsyncRolloutClient, RolloutError, pb

BLOCK = 128


@dataclass
class Plan:
    prompt: list[int]
    turns: list[int]  # tokens each turn samples
    env: list[list[int]]  # what the environment appends after each turn


def plans(n: int, turns: int, vocab: int, seed: int) -> list[Plan]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lengths = [min(128, max(8, int(rng.lognormvariate(3.3, 0.8)))) for _ in range(turns)]
        env = [
            [rng.randrange(20, vocab) for _ in range(rng.randint(20, 200))] for _ in range(turns)
        ]
        prompt = [rng.randrange(20, vocab) for _ in range(rng.randint(16, 64))]
        out.append(Plan(prompt, lengths, env))
    return out


def reusable(usage: pb.Usage, before: pb.Usage, block: int) -> int:
    """The most of a turn's prompt the prefix cache can serve: whole blocks
    of what the engine computed for the trajectory's previous turn, its
    prompt and every sampled token but the last (never fed through the
    model), and never the prompt's last token (vLLM recomputes it for its
    logits). The environment's tokens since were never computed."""
    computed = before.prompt_tokens + before.completion_tokens - 1
    return min(computed, usage.prompt_tokens - 1) // block * block


@dataclass
class Tally:
    output: int = 0
    history: int = 0  # prompt tokens of turns after the first
    cached: int = 0
    ceiling: int = 0  # of those, what the prefix cache could serve (reusable)
    cut: int = 0  # trajectories that could not go on
    block: int = BLOCK  # the server's KV block size

    def turn(self, usage: pb.Usage, before: pb.Usage | None) -> None:
        """A turn's usage; `before`: its trajectory's previous turn's (None: the first)."""
        self.output += usage.completion_tokens
        if before is not None:
            self.history += usage.prompt_tokens
            self.cached += usage.cached_prompt_tokens
            self.ceiling += reusable(usage, before, self.block)

    def add(self, other: Tally) -> None:
        self.output += other.output
        self.history += other.history
        self.cached += other.cached
        self.ceiling += other.ceiling
        self.cut += other.cut


@dataclass
class Result:
    way: str
    seconds: float
    cpu: float
    tally: Tally = field(default_factory=Tally)


def sampling(n: int) -> dict:
    return {"max_tokens": n, "ignore_eos": True, "temperature": 1.0}


async def by_session(c: AsyncRolloutClient, p: Plan, tally: Tally) -> None:
    before = None
    async with await c.open_session(prompt_token_ids=p.prompt) as s:
        for i, (n, env) in enumerate(zip(p.turns, p.env)):
            turn = await s.generate(**sampling(n))
            tally.turn(turn.usage, before)
            before = turn.usage
            if i + 1 < len(p.turns):
                await s.append(token_ids=env)


async def by_ids(c: AsyncRolloutClient, p: Plan, tally: Tally) -> None:
    history, before = list(p.prompt), None
    for n, env in zip(p.turns, p.env):
        r = await c.generate(prompt_token_ids=history, **sampling(n))
        tally.turn(r.usage, before)
        before = r.usage
        history += list(r.completions[0].token_ids) + env


async def by_text(c: AsyncRolloutClient, p: Plan, tally: Tally) -> None:
    history, before = (await c.detokenize(p.prompt)).text, None
    for n, env in zip(p.turns, p.env):
        try:
            r = await c.generate(prompt_text=history, **sampling(n))
        except RolloutError:  # the re-tokenized history outgrew the context
            tally.cut += 1
            return
        tally.turn(r.usage, before)  # its ceiling: if the re-encoded history kept the ids
        before = r.usage
        history += r.completions[0].text + (await c.detokenize(env)).text


def _cpu(pid: int) -> float:
    return sum(tree_cpu_seconds(pid))


async def run_way(target: str, pid: int | None, way, work: list[Plan], block: int) -> Result:
    async with AsyncRolloutClient(target, timeout=600) as c:
        await c.reset_caches()
        tally = Tally(block=block)
        cpu0 = _cpu(pid) if pid else 0.0
        t0 = time.perf_counter()
        await asyncio.gather(*(way(c, p, tally) for p in work))
        seconds = time.perf_counter() - t0
        cpu = (_cpu(pid) - cpu0) if pid else 0.0
        return Result(way.__name__.removeprefix("by_"), seconds, cpu, tally)


def report(results: list[Result]) -> None:
    base = results[0]
    base_rate = base.tally.output / base.seconds
    print(
        f"{'way':8} {'seconds':>8} {'out tok/s':>10} {'vs sessions':>11} "
        f"{'cpu s/1k tok':>12} {'cached share':>12} {'block ceiling':>13} {'cut':>4}"
    )
    for r in results:
        t = r.tally
        rate = t.output / r.seconds
        cpu = f"{1000 * r.cpu / t.output:.3f}" if r.cpu else "-"
        print(
            f"{r.way:8} {r.seconds:8.2f} {rate:10.0f} {rate / base_rate:11.2f} "
            f"{cpu:>12} {t.cached / t.history:12.3f} {t.ceiling / t.history:13.3f} {t.cut:4}"
        )


async def main_async(args, target: str, pid: int | None) -> None:
    async with AsyncRolloutClient(target, timeout=600) as c:
        await c.wait_until_ready()
        vocab = (await c.server_info()).vocab_size
    work = plans(args.sessions, args.turns, vocab, args.seed)
    ways = (by_session, by_ids, by_text)
    results = [await run_way(target, pid, w, work, args.block_size) for w in ways]
    print(f"{args.sessions} trajectories x {args.turns} turns, all at once")
    report(results)


def workload_args(parser: argparse.ArgumentParser) -> None:
    """The plan's options, and the KV block size of the servers."""
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--block-size",
        type=int,
        default=BLOCK,
        help="the servers' KV block size (vLLM's --block-size; passed to servers started here)",
    )


def server_flags(block: int) -> list[str]:
    """A started server's flags: the defaults but for another block size."""
    return [] if block == BLOCK else ["--block-size", str(block)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", help="a running server (default: start one)")
    workload_args(parser)
    args = parser.parse_args()
    if args.target:
        asyncio.run(main_async(args, args.target, None))
        return
    server = ServerProcess(*server_flags(args.block_size))
    try:
        server.wait_ready()
        asyncio.run(main_async(args, server.target, server.proc.pid))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
