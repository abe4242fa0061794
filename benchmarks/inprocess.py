"""The same engine with no service in front: the ceiling for `compare.py`.

Builds AsyncLLM exactly as `rollout-service serve` does (its own argument
parser, `_engine_args` and `build_engine`, then the same warm-up and
`settle`: the GC heap frozen, vLLM's settings read once) and drives
it with the same closed loop as the gRPC load test, with the SamplingParams
the servicer would build for the same request (so logprobs are computed
here too). Unary-style runs use RequestOutputKind.FINAL_ONLY, streamed runs
DELTA. Runs in its own process so that its engine environment is exactly the
one `compare.py` gives every configuration:

    .venv/bin/python -m benchmarks.inprocess --json out.json --duration 20 -- \\
        --model tiny-qwen2 --max-model-len 2048
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time
import uuid
from pathlib import Path

from benchmarks.lib.loadgen import (
    Record,
    add_closed_loop_args,
    closed_loop_spec,
    closed_loop_workload,
    format_summary,
    machine_ticks,
    run_load,
    steal_percent,
    stream_options,
    summarize,
    tree_cpu_seconds,
)
from rollout.v1 import rollout_pb2 as pb


def service_params(limits, prompt_len, max_tokens, temperature, kind, options=None):
    """The SamplingParams the servicer builds for the load's request (16 in,
    ignore_eos, the sampled tokens' logprobs; a stream's StreamOptions)."""
    from rollout_service.generation.convert import sampling_params_from_proto

    sp = pb.SamplingParams(max_tokens=max_tokens, temperature=temperature, ignore_eos=True)
    return sampling_params_from_proto(sp, limits, prompt_len, kind, options)


class EngineDriver:
    """One `AsyncLLM.generate` per call, timed like the gRPC driver times
    its calls (first token-bearing output, gaps between outputs)."""

    def __init__(
        self, engine, limits, stream: bool, temperature: float, logprobs: bool = True, options=None
    ):
        from vllm.sampling_params import RequestOutputKind

        self.engine, self.limits, self.stream = engine, limits, stream
        self.temperature, self.logprobs = temperature, logprobs
        self.kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
        self.options = options if stream else None  # a stream's StreamOptions

    def _params(self, prompt_len: int, max_tokens: int):
        params = service_params(
            self.limits, prompt_len, max_tokens, self.temperature, self.kind, self.options
        )
        if not self.logprobs:  # what the service's always-on logprobs cost
            params.logprobs = None
        return params

    async def __call__(self, prompt: list[int], max_tokens: int) -> Record:
        params = self._params(len(prompt), max_tokens)
        rec = Record(start=time.perf_counter())
        try:
            async for out in self.engine.generate(
                {"prompt_token_ids": prompt}, params, uuid.uuid4().hex
            ):
                # DELTA outputs carry the new tokens; FINAL_ONLY comes once with all
                rec.tokens_arrived(len(out.outputs[0].token_ids))
        except Exception as e:  # counted like a failed RPC
            rec.error = type(e).__name__
        rec.end = time.perf_counter()
        return rec


def start_engine(serve_args: list[str]):
    """AsyncLLM from `rollout-service serve` arguments, placed on the CPUs
    as the server places itself (this process is its front end, as the
    server is). Returns (engine, limits)."""
    from rollout_service import cli
    from rollout_service.engine import placement
    from rollout_service.engine.startup import build_engine, model_limits

    args = cli.build_serve_parser().parse_args(serve_args)
    engine = build_engine(cli._engine_args(args))
    placement.apply(args.cpu_placement)
    return engine, model_limits(engine)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.inprocess",
        description="Closed-loop load on an in-process AsyncLLM; arguments after -- go to "
        "`rollout-service serve`'s parser.",
    )
    add_closed_loop_args(ap)
    ap.add_argument(
        "--no-logprobs",
        dest="logprobs",
        action="store_false",
        help="ask for no logprobs (the service always computes the sampled ones)",
    )
    ap.add_argument(
        "--modes",
        default="unary,stream",
        help="which runs, in order: unary, stream (default StreamOptions), stream_tuned "
        "(--delta-tokens and --omit-text)",
    )
    ap.add_argument("--json", type=Path, help="write {mode: summary} here")
    return ap


async def run_modes(args, serve_args: list[str]) -> dict:
    """Starts the engine once and runs each mode in turn on it."""
    from rollout_service.engine.startup import settle, warm_up

    engine, limits = start_engine(serve_args)
    try:
        await warm_up(engine)
        # As the server does: the ceiling is the same engine, configured the
        # same way, with no service in front.
        settle()
        results = {}
        for mode in args.modes.split(","):
            stream = mode.startswith("stream")
            options = stream_options(args) if mode == "stream_tuned" else None
            driver = EngineDriver(engine, limits, stream, args.temperature, args.logprobs, options)
            workload = closed_loop_workload(args, limits.vocab_size)
            spec = closed_loop_spec(args)
            cpu0, ticks0 = tree_cpu_seconds(os.getpid()), machine_ticks()
            result = await run_load(driver, workload, spec)
            steal = steal_percent(ticks0, machine_ticks())
            front, engine_cpu = (b - a for a, b in zip(cpu0, tree_cpu_seconds(os.getpid())))
            summary = summarize(result, stream)
            # The same figures benchmarks.compare reads around a server: this
            # process is front end and load client in one.
            per_k = 1000 / max(summary["total_output_tokens"], 1)
            summary["front_cpu_s_per_1k_tokens"] = front * per_k
            summary["engine_cpu_s_per_1k_tokens"] = engine_cpu * per_k
            summary["steal_percent"] = steal
            kind = "DELTA" if stream else "FINAL_ONLY"
            print(format_summary(f"in-process AsyncLLM {kind} {mode}, {spec.describe()}", summary))
            results[mode] = summary
        return results
    finally:
        engine.shutdown()
        # Collected now rather than at interpreter exit, where AsyncLLM.__del__
        # trips over half-torn-down modules and prints a traceback.
        del engine
        gc.collect()


def main() -> int:
    # The same default `rollout-service serve` applies (GiB of KV cache on CPU).
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = build_parser().parse_args(argv[:split])
    results = asyncio.run(run_modes(args, argv[split + 1 :]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
