"""One closed-loop load against one target, in a process of its own.

benchmarks.compare runs every load through this, so that no configuration's
load client inherits state from the one before it in the same process (an
earlier grpc.aio client, event-loop policy, threads): in one process, `vllm
serve` measured after this service's configurations saw its 64 concurrent
requests arrive one at a time ("Running: 1 reqs" in vLLM's log).

    python -m benchmarks.lib.drive grpc|grpc-stream|grpc-many|http|thin|thin-stream|thin-many \\
        TARGET_OR_URL --json out.json [load flags]

(grpc-many: every concurrent request of the load on one GenerateMany stream;
thin: benchmarks.lib.thin_front's raw-bytes methods, thin-many its GenerateMany;
vgrpc: `vllm serve --grpc`'s Generate, unary or streamed, benchmarks.vllm_grpc.)

The JSON is the load's summary (its `total_output_tokens` counts every
request's, warm-up included) plus `client_cpu_seconds`, so that a caller
that reads the server's CPU time around this process can divide one by the
other.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
from pathlib import Path

from benchmarks.lib.loadgen import (
    add_closed_loop_args,
    closed_loop_spec,
    closed_loop_workload,
    run_load,
    summarize,
)

DRIVERS = (
    "grpc", "grpc-stream", "grpc-many", "http", "thin", "thin-stream", "thin-many",
    "vgrpc", "vgrpc-stream",
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.lib.drive", description=__doc__)
    ap.add_argument("driver", choices=DRIVERS)
    ap.add_argument("target", help="host:port (grpc, thin) or the /v1/completions URL (http)")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--logprobs", type=int, help="http, vgrpc: vllm serve's `logprobs`")
    add_closed_loop_args(ap)
    return ap


def make_driver(args):
    if args.driver == "http":
        from benchmarks.lib.compare_servers import HttpDriver

        return HttpDriver(args.target, args.temperature, args.logprobs)
    if args.driver.startswith("vgrpc"):
        from benchmarks.vllm_grpc import SmgDriver

        stream = args.driver.endswith("-stream")
        return SmgDriver(args.target, stream, args.temperature, args.logprobs)
    from benchmarks.lib.loadgen import stream_options

    if args.driver == "grpc-many":
        from benchmarks.load import GrpcManyDriver

        return GrpcManyDriver(
            args.target, temperature=args.temperature, stream_options=stream_options(args)
        )
    if args.driver == "thin-many":
        from benchmarks.lib.thin_front import ManyDriver

        return ManyDriver(args.target, args.temperature, stream_options(args))
    stream = args.driver.endswith("-stream")
    if args.driver.startswith("thin"):
        from benchmarks.lib.thin_front import ThinDriver

        options = stream_options(args) if stream else None
        return ThinDriver(args.target, stream, args.temperature, options)
    from benchmarks.load import GrpcDriver

    return GrpcDriver(
        args.target,
        stream,
        temperature=args.temperature,
        stream_options=stream_options(args),
    )


async def drive(args) -> dict:
    driver = make_driver(args)
    workload = closed_loop_workload(args, args.vocab_size)
    try:
        result = await run_load(driver, workload, closed_loop_spec(args))
    finally:
        await driver.close()
    return summarize(result, stream=args.driver.endswith(("-stream", "-many")))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    summary = asyncio.run(drive(args))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    summary["client_cpu_seconds"] = usage.ru_utime + usage.ru_stime
    args.json.write_text(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
