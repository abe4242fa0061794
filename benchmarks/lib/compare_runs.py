"""One measured run of each configuration benchmarks.compare compares (and
benchmarks.ab drives): its server started (benchmarks.lib.compare_servers),
placed and ready, each of its loads driven in a fresh process
(benchmarks.lib.drive) with the server's CPU time measured around it, and the
server stopped; the in-process AsyncLLM run in a process of its own.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.lib.compare_servers import (
    ENGINE_ARGS,
    MODEL,
    ThinServer,
    VllmServe,
    engine_env,
    model_vocab,
    place,
    placement_args,
    rollout_server,
)
from benchmarks.lib.loadgen import (
    add_closed_loop_args,
    closed_loop_spec,
    format_summary,
    machine_ticks,
    steal_percent,
    tree_cpu_seconds,
)
from benchmarks.lib.profile_split import format_split

CONFIGS = ("ours", "thin", "inprocess", "serve")
# Not run unless asked for (--only ours,floating,...): ours without CPU placement.
EXTRA_CONFIGS = ("floating",)


def add_run_args(ap: argparse.ArgumentParser) -> None:
    """The flags every run reads (benchmarks.compare's and benchmarks.ab's)."""
    add_closed_loop_args(ap)  # per configuration
    ap.add_argument("--serve-logprobs", default="0", help="vllm serve `logprobs`, or none")
    ap.add_argument(
        "--placement",
        choices=("pinned", "floating"),
        default="pinned",
        help="everything but the vLLM worker off the worker's cores, or left to the OS",
    )
    ap.add_argument(
        "--pin-serve",
        action="store_true",
        help="apply --placement pinned to `vllm serve` too (by default it runs as its users "
        "run it: its API server starves pinned beside its engine core)",
    )
    ap.add_argument(
        "--tuned-delta-tokens",
        type=int,
        default=8,
        help="the tuned stream runs (ours and in-process, the same StreamOptions): tokens per "
        "delta, with omit_text; 0 skips them",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="py-spy samples this service's front end during its loads and prints its CPU by "
        "component (py-spy costs CPU: that run's throughput is not comparable)",
    )
    ap.add_argument("--rounds", type=int, default=3, help="times each configuration runs")


def run_parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """A run's command line: `prog`, the first paragraph of `doc`, every
    flag add_run_args gives, defaults shown (compare's, ab's, vllm_grpc's)."""
    ap = argparse.ArgumentParser(
        prog=prog,
        description=doc.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_run_args(ap)
    return ap


def printed(name: str, summary: dict) -> dict:
    """`summary`, printed as it comes in under `name`."""
    print(format_summary(name, summary), flush=True)
    return summary


def stream_flags(args, tuned: bool) -> list[str]:
    """A stream's StreamOptions flags: the shared ones, or the tuned run's."""
    if tuned:
        return ["--delta-tokens", str(args.tuned_delta_tokens), "--omit-text"]
    return ["--delta-tokens", str(args.delta_tokens)] + ["--omit-text"] * args.omit_text


def rate_flags(args) -> list[str]:
    """--rate for a load in another process, when the run is open-loop."""
    return ["--rate", str(args.rate)] if args.rate else []


def drive(
    args, driver: str, target: str, vocab_size: int, server_pid: int, profile=False, **extra
) -> dict:
    """One load through benchmarks.lib.drive, in a fresh process (see its
    docstring for why), with the server's CPU seconds per 1,000 output tokens
    and the load client's, measured around it; `profile`: py-spy samples the
    server's front end during the measured window (benchmarks.lib.profile_split)."""
    out = Path(tempfile.mkstemp(prefix="drive-", suffix=".json")[1])
    cmd = [
        sys.executable, "-m", "benchmarks.lib.drive", driver, target, "--json", str(out),
        "--vocab-size", str(vocab_size), "--concurrency", str(args.concurrency),
        "--duration", str(args.duration), "--warmup", str(args.warmup),
        "--prompt-len", str(args.prompt_len), "--output-len", str(args.output_len),
        "--temperature", str(args.temperature), "--seed", str(args.seed),
    ]  # fmt: skip
    cmd += rate_flags(args)
    if extra.get("logprobs") is not None:
        cmd += ["--logprobs", str(extra["logprobs"])]
    cmd += extra.get("flags", [])
    if args.no_progress:
        cmd.append("--no-progress")
    front0, engine0 = tree_cpu_seconds(server_pid)
    ticks0 = machine_ticks()
    load = subprocess.Popen(cmd)
    spy = None
    if profile:
        from benchmarks.lib.profile_split import Profile

        time.sleep(args.warmup + 2)  # the drive's start-up, then its warm-up
        spy = Profile(server_pid, args.duration - 2)
    if load.wait() != 0:
        raise RuntimeError(f"benchmarks.lib.drive failed ({load.returncode})")
    front1, engine1 = tree_cpu_seconds(server_pid)
    summary = json.loads(out.read_text())
    summary["steal_percent"] = steal_percent(ticks0, machine_ticks())
    per_k = 1000 / max(summary["total_output_tokens"], 1)
    summary["front_cpu_s_per_1k_tokens"] = (front1 - front0) * per_k
    summary["engine_cpu_s_per_1k_tokens"] = (engine1 - engine0) * per_k
    summary["client_cpu_s_per_1k_tokens"] = summary["client_cpu_seconds"] * per_k
    if spy is not None:
        summary["front_components"] = spy.shares()
    return summary


def run_ours(args, floating: bool = False) -> dict:
    """(a) and (b): one server, unary then streaming. ``floating``: the
    server started with --no-cpu-placement, whatever --placement says
    (what its CPU placement is worth, measured in the same run)."""
    server = rollout_server(args, floating)
    prefix = "ours_floating" if floating else "ours"
    name = "rollout-service --no-cpu-placement" if floating else "rollout-service"
    print(f"\n== {name} on {server.target} (log {server.log})", flush=True)
    try:
        server.wait_ready()
        if not floating:
            place(args, server.proc.pid)
        from rollout_client import RolloutClient

        with RolloutClient(server.target) as c:
            vocab = c.server_info().vocab_size
        out = {}
        for kind in ("unary", "stream", "stream_tuned"):
            if kind == "stream_tuned" and (floating or not args.tuned_delta_tokens):
                continue
            stream = kind != "unary"
            driver = "grpc-stream" if stream else "grpc"
            flags = stream_flags(args, kind == "stream_tuned") if stream else []
            summary = drive(
                args, driver, server.target, vocab, server.proc.pid, args.profile, flags=flags
            )
            call = "GenerateStream " + " ".join(flags) if stream else "Generate"
            load = closed_loop_spec(args).describe()
            out[f"{prefix}_{kind}"] = printed(f"{name} {call}, {load}", summary)
            if "front_components" in summary:
                print(
                    "front-end CPU s per 1k output tokens by component (py-spy):\n"
                    + format_split(
                        summary["front_cpu_s_per_1k_tokens"], summary["front_components"]
                    ),
                    flush=True,
                )
        return out
    finally:
        server.stop()


def run_thin(args, model_dir: Path) -> dict:
    """(c): the thinnest gRPC front end, unary, streamed and tuned."""
    server = ThinServer(args)
    print(f"\n== thin gRPC front end on {server.target} (log {server.log})", flush=True)
    try:
        server.wait_ready()
        place(args, server.proc.pid)
        vocab = model_vocab(model_dir)
        out = {}
        for kind in ("unary", "stream", "stream_tuned"):
            if kind == "stream_tuned" and not args.tuned_delta_tokens:
                continue
            stream = kind != "unary"
            flags = stream_flags(args, kind == "stream_tuned") if stream else []
            driver = "thin-stream" if stream else "thin"
            summary = drive(args, driver, server.target, vocab, server.proc.pid, flags=flags)
            call = "stream " + " ".join(flags) if stream else "unary"
            load = closed_loop_spec(args).describe()
            out[f"thin_{kind}"] = printed(f"thin gRPC front end {call}, {load}", summary)
        return out
    finally:
        server.stop()


def run_inprocess(args, modes: list[str] | None = None) -> dict:
    """(d): benchmarks.inprocess in its own process with the same environment;
    `modes` of unary, stream, stream_tuned (default: all that apply)."""
    if modes is None:
        modes = ["unary", "stream"] + ["stream_tuned"] * bool(args.tuned_delta_tokens)
    out_json = Path(tempfile.mkstemp(prefix="inprocess-", suffix=".json")[1])
    log = Path(tempfile.mkstemp(prefix="inprocess-", suffix=".log")[1])
    cmd = [
        sys.executable, "-m", "benchmarks.inprocess",
        "--concurrency", str(args.concurrency), "--duration", str(args.duration),
        "--warmup", str(args.warmup), "--prompt-len", str(args.prompt_len),
        "--output-len", str(args.output_len), "--temperature", str(args.temperature),
        "--seed", str(args.seed), "--json", str(out_json), "--no-progress", *rate_flags(args),
        "--modes", ",".join(modes),
        *stream_flags(args, True),
        "--", "--model", MODEL, *ENGINE_ARGS, *placement_args(args),
    ]  # fmt: skip
    print(f"\n== in-process AsyncLLM (log {log})", flush=True)
    with open(log, "wb") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=engine_env())
    if proc.returncode != 0:
        raise RuntimeError(f"in-process run failed ({proc.returncode}), see {log}")
    results = json.loads(out_json.read_text())
    kinds = {"unary": "FINAL_ONLY", "stream": "DELTA", "stream_tuned": "DELTA, tuned"}
    return {
        f"inprocess_{mode}": printed(
            f"in-process AsyncLLM {kinds[mode]}, {closed_loop_spec(args).describe()}", s
        )
        for mode, s in results.items()
    }


def drive_serve(args, server: VllmServe, vocab_size: int) -> dict:
    """The unary load against `vllm serve`: POST /v1/completions, with
    --serve-logprobs."""
    logprobs = None if args.serve_logprobs == "none" else int(args.serve_logprobs)
    url = server.base + "/v1/completions"
    return drive(args, "http", url, vocab_size, server.proc.pid, logprobs=logprobs)


def run_serve(args, model_dir: Path) -> dict:
    """(e): vllm serve, unary /v1/completions."""
    server = VllmServe(model_dir)
    print(f"\n== vllm serve on {server.base} (log {server.log})", flush=True)
    try:
        server.wait_ready()
        # As its users run it, unless asked: pinned next to its spinning
        # engine core on one core, vLLM's API server starves under a closed
        # loop (measured: 835 tok/s and 20 ServerDisconnectedErrors in 5 s,
        # against 5,720 tok/s and none floating, same machine, same load).
        if args.pin_serve:
            place(args, server.proc.pid)
        summary = drive_serve(args, server, model_vocab(model_dir))
        load = closed_loop_spec(args).describe()
        return {"vllm_serve": printed(f"vllm serve /v1/completions, {load}", summary)}
    finally:
        server.stop()


def run_round(args, model_dir: Path, only: list[str]) -> dict:
    """Every selected configuration once, one engine at a time."""
    results: dict = {}
    if "ours" in only:
        results.update(run_ours(args))
    if "floating" in only:
        results.update(run_ours(args, floating=True))
    if "thin" in only:
        results.update(run_thin(args, model_dir))
    if "inprocess" in only:
        results.update(run_inprocess(args))
    if "serve" in only:
        results.update(run_serve(args, model_dir))
    return results
