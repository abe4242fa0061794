"""Multi-turn trajectories through the OpenAI API, three ways in one run:
this service's session URLs against the whole history re-sent, to this
service and to `vllm serve`.

The workload is benchmarks.sessions' seeded plan (`--sessions` trajectories of
`--turns` turns, all at once; skewed turn lengths, 20 to 200 tokens of
environment between turns) as chat text (benchmarks.lib.chat_turns): every turn
POSTs the whole conversation so far to /chat/completions, as an OpenAI client
does, with `return_token_ids` and `logprobs`. The ways:

- sessions: this service's session URLs (POST /sessions, then each turn on
  `{base_url}/chat/completions`): the server matches the history against the
  one it holds and keeps the sampled ids;
- stateless: this service's /v1/chat/completions, the history rendered and
  tokenized again each turn;
- vllm serve: `vllm serve`'s /v1/chat/completions, the same (what users run
  today), on the same model, engine arguments and environment
  (benchmarks.lib.compare_servers), with `--enable-prompt-tokens-details` for its
  cached-token counts.

One engine at a time (never two at once on 2 cores): per round, this
service's server runs sessions and stateless (caches reset before each), then
`vllm serve` runs its way, the order of servers and ways alternating between
rounds. Each server first runs an unmeasured warm-up (`Work`). This service
places itself (all but vLLM's worker off its core); `vllm serve` runs as its
users run it.

Printed per way: output tokens per second (and against sessions), the front
end's CPU seconds per 1k output tokens (the server's own process: the HTTP
layer and vLLM's output processing; its engine processes beside), the
prompt tokens served from the prefix cache as a share of each turn's history
(turns after the first) beside the whole-block ceiling (sessions.reusable),
and the sampled tokens the next turn's prompt re-tokenized into other ids, of
those it re-sent. The load average before and after says whether the machine
was quiet.

    .venv/bin/python -m benchmarks.openai_sessions                 # 64 x 6, 2 rounds
    .venv/bin/python -m benchmarks.openai_sessions --sessions 4 --turns 2 --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from dataclasses import dataclass, field

from benchmarks.lib.chat_turns import Chat, ChatTally, chats, client, converse, open_session
from benchmarks.lib.compare_servers import MODEL, VllmServe, model_vocab, rollout_server
from benchmarks.lib.loadgen import tree_cpu_seconds
from benchmarks.sessions import plans, server_flags, workload_args
from rollout_client import AsyncRolloutClient

WAYS = ("sessions", "stateless", "vllm serve")


@dataclass
class Row:
    way: str
    seconds: float
    front_cpu: float
    engine_cpu: float
    tally: ChatTally = field(default_factory=ChatTally)


async def run_way(way: str, base: str, pid: int, work: list[Chat], block: int) -> Row:
    """Every trajectory of `work` at once on the server at `base` (HTTP), its
    process tree's CPU measured around them; `block`: its KV block size."""
    tally = ChatTally(block=block)

    async def trajectory(http, chat: Chat) -> None:
        url = base + "/v1/chat/completions"
        if way == "sessions":
            url = await open_session(http, base, chat)
        await converse(http, url, MODEL, chat, tally)

    async with client() as http:
        front0, engine0 = tree_cpu_seconds(pid)
        t0 = time.perf_counter()
        await asyncio.gather(*(trajectory(http, c) for c in work))
        seconds = time.perf_counter() - t0
        front1, engine1 = tree_cpu_seconds(pid)
    return Row(way, seconds, front1 - front0, engine1 - engine0, tally)


@dataclass
class Work:
    """The measured trajectories, and a warm-up of other text (no prefix in
    common: `vllm serve` has no cache reset) and two turns each, run first on
    each server: a fresh server's first large batches run slower (measured
    here: the first way on it at 0.5x to 0.6x of the same way later)."""

    measured: list[Chat]
    warmup: list[Chat]


async def warm(base: str, warmup: list[Chat]) -> None:
    async with client() as http:
        url = base + "/v1/chat/completions"
        await asyncio.gather(*(converse(http, url, MODEL, c, ChatTally()) for c in warmup))


async def reset(target: str) -> None:
    """This service's caches reset over gRPC, so a way finds none of the one before."""
    async with AsyncRolloutClient(target, timeout=60) as c:
        await c.reset_caches()


def ours(args, work: Work, order: tuple[str, ...]) -> list[Row]:
    flags = ["--http-port", "0", *server_flags(args.block_size)]
    server = rollout_server(args, flags=flags)
    try:
        server.wait_ready()
        base = f"http://{server.http_target}"
        asyncio.run(warm(base, work.warmup))
        rows = []
        for way in order:
            asyncio.run(reset(server.target))
            pid = server.proc.pid
            rows.append(asyncio.run(run_way(way, base, pid, work.measured, args.block_size)))
        return rows
    finally:
        server.stop()


def vllm_serve(args, model_dir, work: Work) -> list[Row]:
    flags = ["--enable-prompt-tokens-details", *server_flags(args.block_size)]
    server = VllmServe(model_dir, flags)
    try:
        server.wait_ready()
        asyncio.run(warm(server.base, work.warmup))
        pid = server.proc.pid
        return [
            asyncio.run(run_way("vllm serve", server.base, pid, work.measured, args.block_size))
        ]
    finally:
        server.stop()


def one_round(args, model_dir, work: Work, n: int) -> list[Row]:
    """Round `n`: the servers, and this service's two ways, in alternating order."""
    if n % 2 == 0:
        return ours(args, work, WAYS[:2]) + vllm_serve(args, model_dir, work)
    return vllm_serve(args, model_dir, work) + ours(args, work, WAYS[1::-1])


def table(rows: list[Row], vs: dict[str, float] | None = None) -> str:
    """The rows by WAYS' order; `vs`: each way's throughput against sessions
    (default: this table's)."""
    rows = sorted(rows, key=lambda r: WAYS.index(r.way))
    rate = {r.way: r.tally.output / r.seconds for r in rows}
    vs = vs or {w: rate[w] / rate["sessions"] for w in rate}
    out = [
        f"{'way':10} {'out tok/s':>9} {'vs sessions':>11} {'front cpu s/1k':>14} "
        f"{'engine cpu s/1k':>15} {'cached share':>12} {'block ceiling':>13} "
        f"{'re-tokenized':>16} {'cut':>4}"
    ]
    for r in rows:
        t, per_k = r.tally, 1000 / max(1, r.tally.output)
        out.append(
            f"{r.way:10} {rate[r.way]:9.0f} {vs[r.way]:11.2f} {r.front_cpu * per_k:14.3f} "
            f"{r.engine_cpu * per_k:15.3f} {t.cached / max(1, t.history):12.3f} "
            f"{t.ceiling / max(1, t.history):13.3f} "
            f"{f'{t.retokenized} of {t.resent}':>16} {t.cut:4}"
        )
    return "\n".join(out)


def pooled(rounds: list[list[Row]]) -> tuple[list[Row], dict[str, float]]:
    """Each way's rounds summed, and the median over rounds of its
    throughput against sessions in the same round."""
    rows, ratios = [], {}
    for way in WAYS:
        mine = [r for rnd in rounds for r in rnd if r.way == way]
        total = Row(way, sum(r.seconds for r in mine), 0.0, 0.0)
        for r in mine:
            total.front_cpu += r.front_cpu
            total.engine_cpu += r.engine_cpu
            total.tally.add(r.tally)
        rows.append(total)
        ratios[way] = statistics.median(
            (r.tally.output / r.seconds) / (s.tally.output / s.seconds)
            for rnd in rounds
            for r in rnd
            for s in rnd
            if r.way == way and s.way == "sessions"
        )
    return rows, ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_args(parser)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--placement",
        choices=("pinned", "floating"),
        default="pinned",
        help="this service's processes but vLLM's worker off the worker's core, or not",
    )
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from rollout_service.engine.tiny_models import ensure_model

    model_dir = ensure_model(MODEL)
    decode = AutoTokenizer.from_pretrained(model_dir).decode
    vocab = model_vocab(model_dir)
    work = Work(
        chats(plans(args.sessions, args.turns, vocab, args.seed), decode),
        chats(plans(args.sessions, 2, vocab, args.seed + 1), decode),
    )
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    rounds = []
    for n in range(args.rounds):
        rows = one_round(args, model_dir, work, n)
        print(
            f"\nround {n + 1} of {args.rounds}: {args.sessions} trajectories x {args.turns} turns"
        )
        print(table(rows), flush=True)
        rounds.append(rows)
    if args.rounds > 1:
        rows, ratios = pooled(rounds)
        print(f"\nall {args.rounds} rounds (vs sessions: the median of the rounds' ratios)")
        print(table(rows, ratios))
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
