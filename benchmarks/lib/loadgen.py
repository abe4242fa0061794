"""Closed- and open-loop load generation shared by every benchmark here.

A *driver* is an async callable `driver(prompt_token_ids, max_tokens) ->
Record` that sends one request and times it itself (the gRPC service, the
in-process engine and `vllm serve` each have one). Everything else (arrival
process, warm-up, stopping, statistics, progress line) lives here once, so
that the configurations compared in `benchmarks.compare` are driven by
literally the same loop and differ only in what a request goes through.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PROMPT_TOKEN_MIN = 10  # prompt ids are drawn from [10, vocab): low ids are often special


@dataclass(frozen=True)
class Range:
    """A length setting: fixed (`16`) or uniform over a closed range (`8-32`)."""

    lo: int
    hi: int

    @classmethod
    def parse(cls, text: str) -> Range:
        lo, _, hi = str(text).partition("-")
        r = cls(int(lo), int(hi or lo))
        if not 1 <= r.lo <= r.hi:
            raise ValueError(f"bad length range {text!r}: want N or LO-HI with 1 <= LO <= HI")
        return r

    def draw(self, rng: random.Random) -> int:
        return self.lo if self.lo == self.hi else rng.randint(self.lo, self.hi)

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}-{self.hi}"


class Workload:
    """Random prompts (token ids) and output lengths, seeded: two runs with the
    same seed send the same sequence of requests."""

    def __init__(self, prompt_len: Range, output_len: Range, vocab_size: int, seed: int = 0):
        if vocab_size <= PROMPT_TOKEN_MIN:
            raise ValueError(
                f"vocab_size {vocab_size} leaves no ids in [{PROMPT_TOKEN_MIN}, vocab)"
            )
        self.prompt_len, self.output_len = prompt_len, output_len
        self._ids = range(PROMPT_TOKEN_MIN, vocab_size)
        self._rng = random.Random(seed)

    def next(self) -> tuple[list[int], int]:
        n = self.prompt_len.draw(self._rng)
        return self._rng.choices(self._ids, k=n), self.output_len.draw(self._rng)


@dataclass(slots=True)
class Record:
    """One request as the client saw it (perf_counter seconds)."""

    start: float
    end: float = 0.0
    tokens: int = 0  # output tokens received
    ttft: float | None = None  # streaming: start to first token-bearing message
    itl: list[float] = field(default_factory=list)  # streaming: gaps between token messages
    error: str | None = None  # status code name (or exception type) on failure
    expected: int = 0  # max_tokens asked for
    _last: float | None = None  # when the previous token-bearing message came

    def tokens_arrived(self, new_tokens: int) -> None:
        """Records a message carrying `new_tokens` tokens: TTFT for the first,
        an inter-token gap for the others."""
        if not new_tokens:
            return
        now = time.perf_counter()
        if self._last is None:
            self.ttft = now - self.start
        else:
            self.itl.append(now - self._last)
        self._last = now
        self.tokens += new_tokens


Driver = Callable[[list[int], int], Awaitable[Record]]


@contextlib.contextmanager
def recorded() -> Iterator[Record]:
    """A Record timed around the block, which fills in its tokens; a gRPC
    error ends the block and becomes the record's error (its status code)."""
    import grpc

    rec = Record(start=time.perf_counter())
    try:
        yield rec
    except grpc.aio.AioRpcError as e:
        rec.error = e.code().name
    rec.end = time.perf_counter()


class OneStreamDriver:
    """A driver whose concurrent calls all share one bidi stream (opened on
    the first call; GenerateMany and the thin front's twin): each call writes
    its request under a tag of its own and waits for the event that finishes
    it. Subclasses give `open()` (the call), `request(tag, prompt,
    max_tokens)` (the message to write) and `events(message)`: (tag, new
    tokens, finished, error or None) per generation the message speaks of."""

    def __init__(self, channel) -> None:
        self.channel = channel
        self.call = self.reader = None
        self.pending: dict[int, tuple[Record, asyncio.Event]] = {}
        self.next_tag = 0
        self.write_lock = asyncio.Lock()  # grpc.aio takes one write at a time

    def open(self):
        raise NotImplementedError

    def request(self, tag: int, prompt: list[int], max_tokens: int):
        raise NotImplementedError

    def events(self, message):
        raise NotImplementedError

    async def _read(self) -> None:
        import grpc

        try:
            async for message in self.call:
                for tag, tokens, finished, error in self.events(message):
                    rec, done = self.pending[tag]
                    rec.tokens_arrived(tokens)
                    if error is not None:
                        rec.error = error
                    if finished:
                        done.set()
        except grpc.aio.AioRpcError as e:
            for rec, done in self.pending.values():
                rec.error = e.code().name
                done.set()

    async def __call__(self, prompt: list[int], max_tokens: int) -> Record:
        if self.call is None:
            self.call = self.open()
            self.reader = asyncio.create_task(self._read())
        tag, self.next_tag = self.next_tag, self.next_tag + 1
        rec, done = Record(start=time.perf_counter()), asyncio.Event()
        self.pending[tag] = (rec, done)
        async with self.write_lock:
            await self.call.write(self.request(tag, prompt, max_tokens))
        await done.wait()
        del self.pending[tag]
        rec.end = time.perf_counter()
        return rec

    async def close(self) -> None:
        if self.call is not None:
            await self.call.done_writing()
            await self.reader
        await self.channel.close()


@dataclass
class LoadSpec:
    """How to drive: exactly one of concurrency/rate, one of duration/requests."""

    concurrency: int | None = None
    rate: float | None = None  # requests/s, Poisson arrivals
    duration: float | None = None  # measured seconds (after warm-up)
    requests: int | None = None  # measured requests (after warm-up)
    warmup: float = 0.0
    progress: bool = True
    seed: int = 0

    def describe(self) -> str:
        mode = (
            f"closed loop, concurrency {self.concurrency}"
            if self.concurrency
            else f"open loop, {self.rate:g} req/s Poisson"
        )
        length = f"{self.duration:g} s" if self.duration else f"{self.requests} requests"
        return f"{mode}, {length} (+{self.warmup:g} s warm-up)"


@dataclass
class RunResult:
    """Every record of a run and the measurement window's start."""

    records: list[Record]
    t0: float  # warm-up over: requests started from here on are measured
    t1: float  # end of the throughput window
    spec: LoadSpec
    # CPU this process used per wall second over the whole run, in cores: the
    # client shares the machine with the server, so its cost is part of the result.
    client_cpu_cores: float = 0.0


class _Run:
    """State of one run: issuing, counters for the progress line."""

    def __init__(self, driver: Driver, workload: Workload, spec: LoadSpec):
        self.driver, self.workload, self.spec = driver, workload, spec
        self.records: list[Record] = []
        self.t_begin = time.perf_counter()
        self.t0 = self.t_begin + spec.warmup
        self.measured_issued = self.measured_done = 0
        self.inflight = self.tokens = self.errors = 0

    def may_issue(self) -> bool:
        if self.spec.duration is not None:
            return time.perf_counter() < self.t0 + self.spec.duration
        return self.measured_issued < self.spec.requests

    async def one(self) -> None:
        prompt, max_tokens = self.workload.next()
        start = time.perf_counter()
        measured = start >= self.t0
        self.measured_issued += measured
        self.inflight += 1
        try:
            rec = await self.driver(prompt, max_tokens)
        except Exception as e:  # a driver bug must not stop the run silently
            rec = Record(start=start, end=time.perf_counter(), error=type(e).__name__)
        finally:
            self.inflight -= 1
        rec.expected = max_tokens
        self.records.append(rec)
        self.measured_done += measured
        self.tokens += rec.tokens
        self.errors += rec.error is not None

    async def closed_loop(self, concurrency: int) -> None:
        async def worker():
            while self.may_issue():
                await self.one()

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def open_loop(self, rate: float) -> None:
        """Arrivals on an absolute Poisson schedule, so that a slow server
        does not slow the arrivals down (that would make it closed-loop)."""
        rng = random.Random(self.spec.seed + 1)
        tasks: set[asyncio.Task] = set()
        due = time.perf_counter()
        while True:
            due += rng.expovariate(rate)
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if not self.may_issue():
                break
            task = asyncio.create_task(self.one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*list(tasks))

    async def progress(self) -> None:
        """A live line: done requests, recent tok/s, errors, in flight."""
        from tqdm import tqdm

        spec = self.spec
        timed = spec.duration is not None
        total = spec.warmup + spec.duration if timed else spec.requests
        unit = "s" if timed else "req"
        fmt = "{l_bar}{bar:20}| {n:.0f}/{total:.0f} " + unit + " {postfix}"
        # disable=None: no bar when stderr is not a terminal (logs stay clean)
        with tqdm(total=total, bar_format=fmt, leave=False, disable=None) as bar:
            # tok/s over the last ~4 s: completions come in waves
            history = collections.deque([(time.perf_counter(), 0)], maxlen=8)
            while True:
                await asyncio.sleep(0.5)
                now = time.perf_counter()
                bar.n = min(now - self.t_begin, total) if timed else self.measured_done
                history.append((now, self.tokens))
                rate = (history[-1][1] - history[0][1]) / (now - history[0][0])
                phase = "warm-up" if now < self.t0 else "measure"
                bar.set_postfix_str(
                    f"{phase} done={len(self.records)} tok/s={rate:,.0f} "
                    f"err={self.errors} inflight={self.inflight}"
                )


async def run_load(driver: Driver, workload: Workload, spec: LoadSpec) -> RunResult:
    """Drives `driver` as `spec` says; returns once every issued request ended."""
    if (spec.concurrency is None) == (spec.rate is None):
        raise ValueError("give exactly one of concurrency and rate")
    if (spec.duration is None) == (spec.requests is None):
        raise ValueError("give exactly one of duration and requests")
    run = _Run(driver, workload, spec)
    cpu0 = time.process_time()
    ticker = asyncio.create_task(run.progress()) if spec.progress else None
    try:
        if spec.concurrency:
            await run.closed_loop(spec.concurrency)
        else:
            await run.open_loop(spec.rate)
    finally:
        if ticker is not None:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
    measured_ends = [r.end for r in run.records if r.start >= run.t0]
    if spec.duration is not None:
        t1 = run.t0 + spec.duration
    else:
        t1 = max(measured_ends, default=run.t0)
    cpu = (time.process_time() - cpu0) / max(time.perf_counter() - run.t_begin, 1e-9)
    return RunResult(records=run.records, t0=run.t0, t1=t1, spec=spec, client_cpu_cores=cpu)


def percentiles(values) -> dict[str, float] | None:
    """p50/p90/p99/mean/max in seconds, or None when there is nothing."""
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return None
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "mean": float(a.mean()),
        "max": float(a.max()),
    }


def _overlap_share(r: Record, t0: float, t1: float) -> float:
    """The fraction of a request's lifetime that lies inside [t0, t1]."""
    life = r.end - r.start
    if life <= 0:
        return float(t0 <= r.end <= t1)
    return max(0.0, min(r.end, t1) - max(r.start, t0)) / life


def summarize(result: RunResult, stream: bool) -> dict[str, Any]:
    """Statistics of a run.

    Throughput spreads each successful request's output tokens evenly over
    its lifetime and counts the share that falls inside the window [t0, t1]:
    with equal output lengths a closed loop completes requests in waves, and
    counting whole requests at their end would quantise short windows by a
    whole wave. Latency counts every request that *started* after warm-up
    (in-flight ones are drained to their end).
    """
    t0, t1 = result.t0, result.t1
    measured = [r for r in result.records if r.start >= t0]
    ok = [r for r in measured if r.error is None]
    shares = [(r, _overlap_share(r, t0, t1)) for r in result.records if r.error is None]
    window = max(t1 - t0, 1e-9)
    summary: dict[str, Any] = {
        "requests": len(measured),
        "ok": len(ok),
        "errors": dict(Counter(r.error for r in measured if r.error is not None)),
        "incomplete": sum(r.tokens < r.expected for r in ok),
        "window_seconds": window,
        "output_tokens_per_s": sum(r.tokens * f for r, f in shares) / window,
        # Every successful request's, warm-up included: what CPU time read
        # around the whole load is divided by.
        "total_output_tokens": sum(r.tokens for r, _ in shares),
        "requests_per_s": sum(f for _, f in shares) / window,
        "latency": percentiles([r.end - r.start for r in ok]),
        "client_cpu_cores": result.client_cpu_cores,
    }
    if stream:
        summary["ttft"] = percentiles([r.ttft for r in ok if r.ttft is not None])
        gaps = [g for r in ok for g in r.itl]
        summary["itl"] = percentiles(gaps)
    return summary


def _ms(p: dict[str, float] | None) -> str:
    if p is None:
        return "n/a"
    return "  ".join(f"{k} {p[k] * 1000:8.1f} ms" for k in ("p50", "p90", "p99"))


def format_summary(title: str, s: dict[str, Any]) -> str:
    """A few aligned lines for the terminal."""
    lines = [
        title,
        f"  requests    {s['ok']} ok, {sum(s['errors'].values())} errors, "
        f"{s['incomplete']} shorter than max_tokens",
        f"  throughput  {s['output_tokens_per_s']:,.0f} output tok/s, "
        f"{s['requests_per_s']:,.1f} req/s over {s['window_seconds']:.1f} s "
        f"(this process: {s['client_cpu_cores']:.2f} cores)",
        f"  latency     {_ms(s['latency'])}",
    ]
    if "ttft" in s:
        lines.append(f"  TTFT        {_ms(s['ttft'])}")
        lines.append(f"  ITL         {_ms(s['itl'])}")
    if s["errors"]:
        lines.append("  errors      " + ", ".join(f"{k}: {v}" for k, v in s["errors"].items()))
    return "\n".join(lines)


def add_closed_loop_args(ap) -> None:
    """The load flags benchmarks.compare, .drive and .inprocess share, with
    the same defaults (closed loop, 64 concurrent, 16 in / 64 out, 20 s);
    `--rate` makes it an open loop."""
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument(
        "--rate",
        type=float,
        help="open loop instead: Poisson arrivals at this many requests/s (latency at a load "
        "the server can carry, not the queue of a saturated one)",
    )
    ap.add_argument("--duration", type=float, default=20.0, help="measured seconds")
    ap.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds before")
    ap.add_argument("--prompt-len", type=Range.parse, default=Range(16, 16))
    ap.add_argument("--output-len", type=Range.parse, default=Range(64, 64))
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument(
        "--delta-tokens", type=int, default=0, help="streams: StreamOptions.delta_tokens"
    )
    ap.add_argument("--omit-text", action="store_true", help="streams: StreamOptions.omit_text")


def closed_loop_spec(args) -> LoadSpec:
    """The LoadSpec of add_closed_loop_args' flags."""
    return LoadSpec(
        concurrency=None if args.rate else args.concurrency,
        rate=args.rate or None,
        duration=args.duration,
        warmup=args.warmup,
        progress=not args.no_progress,
        seed=args.seed,
    )


def closed_loop_workload(args, vocab_size: int) -> Workload:
    """The Workload of add_closed_loop_args' flags."""
    return Workload(args.prompt_len, args.output_len, vocab_size, args.seed)


def stream_options(args):
    """The StreamOptions of add_closed_loop_args' flags (what a stream asks for)."""
    from rollout.v1 import rollout_pb2 as pb

    return pb.StreamOptions(delta_tokens=args.delta_tokens, omit_text=args.omit_text)


def machine_ticks() -> tuple[int, int]:
    """(steal, all) clock ticks of this machine's CPUs so far (/proc/stat):
    steal is time a virtual machine's host ran something else on its cores."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    return ticks[7], sum(ticks)


def steal_percent(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of the CPUs' time stolen between two machine_ticks()."""
    return 100 * (after[0] - before[0]) / max(after[1] - before[1], 1)


def tree_cpu_seconds(root_pid: int) -> tuple[float, float]:
    """User plus system CPU seconds so far of a server's front-end process
    (this service's, or `vllm serve`'s API server: the gRPC or HTTP layer and
    vLLM's output processing) and of its descendants (engine core, workers)."""
    import psutil

    def cpu(p) -> float:
        try:
            t = p.cpu_times()
            return t.user + t.system
        except psutil.NoSuchProcess:
            return 0.0

    root = psutil.Process(root_pid)
    return cpu(root), sum(cpu(p) for p in root.children(recursive=True))
