"""Load test for a running rollout-service.

Closed loop (a fixed number of requests always in flight) or open loop
(Poisson arrivals at a fixed rate), unary or streaming, optionally with full
weight updates pushed while the load runs. It talks grpc.aio to the
rollout.v1 stubs directly (no client-library layers), so that the client
costs as little CPU as possible on the machine it shares with the server.

    .venv/bin/python -m benchmarks.load --target 127.0.0.1:50051 --concurrency 64 \\
        --prompt-len 16 --output-len 64 --stream --duration 30 --warmup 5
    .venv/bin/python -m benchmarks.load --rate 100 --prompt-len 8-32 --output-len 16-128
    .venv/bin/python -m benchmarks.load --concurrency 1,8,32,64 --plot sweep.png --json sweep.json
    .venv/bin/python -m benchmarks.load --concurrency 32 --update-every 5 --duration 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import grpc

from benchmarks.lib.loadgen import (
    LoadSpec,
    OneStreamDriver,
    Range,
    Record,
    Workload,
    format_summary,
    run_load,
    stream_options,
    summarize,
)
from benchmarks.lib.mixed import UpdatePusher, analyse, format_updates
from rollout.v1 import rollout_pb2 as pb
from rollout.v1 import rollout_pb2_grpc
from rollout_client.cli import add_connection_args, connection_options
from rollout_client.client import ConnectionOptions, RolloutError


class GrpcDriver:
    """Sends one Generate or GenerateStream per call, round-robin over a few
    channels (each its own connection)."""

    def __init__(
        self,
        target: str,
        stream: bool,
        channels: int = 1,
        temperature: float = 1.0,
        timeout: float = 600.0,
        connection: ConnectionOptions | None = None,
        stream_options: pb.StreamOptions | None = None,
    ):
        self.stream, self.temperature, self.timeout = stream, temperature, timeout
        self.stream_options = stream_options
        connection = connection or ConnectionOptions()
        self.metadata = connection.metadata()
        self.channels = [
            connection.channel(target, aio=True, own_connection=True) for _ in range(channels)
        ]
        self.stubs = [rollout_pb2_grpc.RolloutServiceStub(c) for c in self.channels]
        self._next = 0

    def _stub(self):
        self._next = (self._next + 1) % len(self.stubs)
        return self.stubs[self._next]

    def _params(self, max_tokens: int) -> pb.SamplingParams:
        return pb.SamplingParams(
            max_tokens=max_tokens, temperature=self.temperature, ignore_eos=True
        )

    async def __call__(self, prompt: list[int], max_tokens: int) -> Record:
        if self.stream:
            return await self._streamed(prompt, max_tokens)
        request = pb.GenerateRequest(
            prompt_token_ids=prompt, sampling_params=self._params(max_tokens)
        )
        rec = Record(start=time.perf_counter())
        try:
            response = await self._stub().Generate(
                request, timeout=self.timeout, metadata=self.metadata
            )
            rec.tokens = response.usage.completion_tokens
        except grpc.aio.AioRpcError as e:
            rec.error = e.code().name
        rec.end = time.perf_counter()
        return rec

    async def _streamed(self, prompt: list[int], max_tokens: int) -> Record:
        request = pb.GenerateStreamRequest(
            prompt_token_ids=prompt,
            sampling_params=self._params(max_tokens),
            stream_options=self.stream_options,
        )
        rec = Record(start=time.perf_counter())
        try:
            stream = self._stub().GenerateStream(
                request, timeout=self.timeout, metadata=self.metadata
            )
            async for msg in stream:
                rec.tokens_arrived(len(msg.token_ids))
        except grpc.aio.AioRpcError as e:
            rec.error = e.code().name
        rec.end = time.perf_counter()
        return rec

    async def close(self) -> None:
        for c in self.channels:
            await c.close()


class GrpcManyDriver(OneStreamDriver):
    """Every concurrent call of the load on one GenerateMany stream, each
    request under its own request_id (its tag)."""

    def __init__(
        self,
        target: str,
        temperature: float = 1.0,
        timeout: float = 3600.0,
        connection: ConnectionOptions | None = None,
        stream_options: pb.StreamOptions | None = None,
    ):
        connection = connection or ConnectionOptions()
        super().__init__(connection.channel(target, aio=True, own_connection=True))
        self.temperature, self.timeout = temperature, timeout
        self.stream_options = stream_options
        self.metadata = connection.metadata()
        self.stub = rollout_pb2_grpc.RolloutServiceStub(self.channel)

    def open(self):
        return self.stub.GenerateMany(timeout=self.timeout, metadata=self.metadata)

    def request(self, tag: int, prompt: list[int], max_tokens: int) -> pb.GenerateManyRequest:
        params = pb.SamplingParams(
            max_tokens=max_tokens, temperature=self.temperature, ignore_eos=True
        )
        return pb.GenerateManyRequest(
            request=pb.GenerateStreamRequest(
                request_id=str(tag),
                prompt_token_ids=prompt,
                sampling_params=params,
                stream_options=self.stream_options,
            )
        )

    def events(self, response: pb.GenerateManyResponse):
        for d in response.deltas:
            yield int(d.request_id), len(d.token_ids), d.HasField("usage"), None
        for f in response.failures:
            yield int(f.request_id), 0, True, f"code {f.code}"


def parse_list(kind):
    """argparse type for `1,8,32,64`."""

    def parse(text: str):
        return [kind(x) for x in text.split(",") if x]

    return parse


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.load",
        description=__doc__.split("\n\n")[0],
    )
    ap.add_argument("--target", default="127.0.0.1:50051", help="HOST:PORT (default: %(default)s)")
    add_connection_args(ap)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument(
        "--concurrency",
        type=parse_list(int),
        help="closed loop, in flight; a list sweeps (default: 64)",
    )
    mode.add_argument("--rate", type=parse_list(float), help="open loop, req/s; a list sweeps")
    length = ap.add_mutually_exclusive_group()
    length.add_argument("--duration", type=float, help="measured seconds per run (default: 30)")
    length.add_argument("--requests", type=int, help="measured requests per run")
    ap.add_argument(
        "--warmup",
        type=float,
        default=5.0,
        help="seconds excluded from the stats (default: %(default)s)",
    )
    ap.add_argument(
        "--prompt-len", type=Range.parse, default=Range(16, 16), help="N or LO-HI (default: 16)"
    )
    ap.add_argument(
        "--output-len", type=Range.parse, default=Range(64, 64), help="N or LO-HI (default: 64)"
    )
    ap.add_argument("--stream", action="store_true", help="GenerateStream instead of Generate")
    ap.add_argument("--delta-tokens", type=int, default=0, help="with --stream: tokens per delta")
    ap.add_argument("--omit-text", action="store_true", help="with --stream: token ids only")
    ap.add_argument("--temperature", type=float, default=1.0, help="(default: %(default)s)")
    ap.add_argument(
        "--channels",
        type=int,
        default=1,
        help="gRPC channels, each its own connection (default: 1)",
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="per-request deadline, s (default: %(default)s)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--update-every", type=float, help="push a full UpdateWeights every S s")
    ap.add_argument(
        "--pause-mode", choices=("wait", "abort"), default="wait", help="of the updates"
    )
    ap.add_argument(
        "--update-window", type=float, default=2.0, help="before/after window, s (default: 2)"
    )
    ap.add_argument(
        "--wait-ready", type=float, default=0.0, help="first wait up to S s for SERVING"
    )
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--plot", type=Path, help="PNG of throughput and latency over the sweep")
    ap.add_argument("--no-progress", action="store_true", help="no live progress line")
    return ap


def run_specs(args) -> list[LoadSpec]:
    """One LoadSpec per sweep point."""
    duration = args.duration if args.requests is None else None
    if duration is None and args.requests is None:
        duration = 30.0
    common = dict(
        duration=duration,
        requests=args.requests,
        warmup=args.warmup,
        progress=not args.no_progress,
        seed=args.seed,
    )
    if args.rate:
        return [LoadSpec(rate=r, **common) for r in args.rate]
    return [LoadSpec(concurrency=c, **common) for c in args.concurrency or [64]]


async def server_info(
    target: str, wait_ready: float, connection: ConnectionOptions | None = None
) -> pb.GetServerInfoResponse:
    """The served model's facts; waits for SERVING first when asked."""
    from rollout_client import AsyncRolloutClient

    async with AsyncRolloutClient(target, options=connection or ConnectionOptions()) as c:
        if wait_ready:
            await c.wait_until_ready(timeout=wait_ready)
        return await c.server_info(timeout=30)


async def run_one(args, spec: LoadSpec, driver: GrpcDriver, workload: Workload) -> dict:
    """One run (with the update pusher alongside when asked); its results."""
    pusher = None
    if args.update_every:
        pusher = UpdatePusher(
            args.target, args.update_every, args.pause_mode, args.seed, connection_options(args)
        )
        size = await pusher.prepare()
        print(
            f"updates: {len(pusher.weights)} tensors, {size / 1e6:.1f} MB every "
            f"{args.update_every:g} s after warm-up",
            file=sys.stderr,
        )
        first = time.perf_counter() + spec.warmup + args.update_every
        task = asyncio.create_task(pusher.run(first))
    try:
        result = await run_load(driver, workload, spec)
    finally:
        if pusher is not None:
            pusher.stop()
            await task
            await pusher.close()
    out = {
        "concurrency": spec.concurrency,
        "rate": spec.rate,
        "summary": summarize(result, args.stream),
    }
    if pusher is not None:
        out["updates"] = analyse(pusher.updates, result, args.update_window)
    return out


def describe(args, spec: LoadSpec) -> str:
    call = "GenerateStream" if args.stream else "Generate"
    return (
        f"{call}, prompt {args.prompt_len} tokens, output {args.output_len} tokens "
        f"(ignore_eos), {spec.describe()}"
    )


def plot_sweep(runs: list[dict], stream: bool, path: Path) -> None:
    """Throughput and p50/p99 latency (and TTFT when streaming) against the
    swept concurrency or rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = "rate" if runs[0]["rate"] is not None else "concurrency"
    xs = [r[key] for r in runs]
    s = [r["summary"] for r in runs]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax1.plot(xs, [x["output_tokens_per_s"] for x in s], "o-")
    xlabel = "rate (req/s)" if key == "rate" else key
    ax1.set(xlabel=xlabel, ylabel="output tokens/s", title="throughput")
    series = [("latency", "request")] + ([("ttft", "TTFT")] if stream else [])
    for metric, name in series:
        for q, style in (("p50", "o-"), ("p99", "s--")):
            ys = [x[metric][q] * 1000 if x[metric] else float("nan") for x in s]
            ax2.plot(xs, ys, style, label=f"{name} {q}")
    ax2.set(xlabel=xlabel, ylabel="ms", title="latency")
    ax2.legend()
    for ax in (ax1, ax2):
        if key == "concurrency" and max(xs) / max(min(xs), 1) >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


async def main_async(args) -> dict:
    info = await server_info(args.target, args.wait_ready, connection_options(args))
    if args.prompt_len.hi + args.output_len.hi > info.max_model_len:
        raise SystemExit(f"prompt + output can exceed max_model_len {info.max_model_len}")
    print(
        f"server {args.target}: {info.model}, vocab {info.vocab_size}, "
        f"version {info.weight_version}",
        file=sys.stderr,
    )
    driver = GrpcDriver(
        args.target,
        args.stream,
        args.channels,
        args.temperature,
        args.timeout,
        connection_options(args),
        stream_options(args),
    )
    runs = []
    try:
        for spec in run_specs(args):
            workload = Workload(args.prompt_len, args.output_len, info.vocab_size, args.seed)
            run = await run_one(args, spec, driver, workload)
            print(format_summary(describe(args, spec), run["summary"]), flush=True)
            if "updates" in run:
                print(format_updates(run["updates"], args.update_window), flush=True)
            runs.append(run)
    finally:
        await driver.close()
    config = {k: str(v) if isinstance(v, (Range, Path)) else v for k, v in vars(args).items()}
    return {"config": config, "model": info.model, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        results = asyncio.run(main_async(args))
    except RolloutError as e:  # e.g. UNAUTHENTICATED: say so, without a traceback
        print(f"error: {e.code.name}: {e.details}", file=sys.stderr)
        return 1
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        plot_sweep(results["runs"], args.stream, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    errors = sum(sum(r["summary"]["errors"].values()) for r in results["runs"])
    failed_updates = sum(
        u["error"] is not None for r in results["runs"] for u in r.get("updates", [])
    )
    return 1 if errors or failed_updates else 0


if __name__ == "__main__":
    sys.exit(main())
