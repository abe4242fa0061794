"""This service against the same engine in-process and against `vllm serve`.

One command, one run, one engine at a time (never two at once: on a 2-core
machine anything running beside an engine skews it badly):

    .venv/bin/python -m benchmarks.compare [--duration 20] [--json results.json]

On the embedded tiny-qwen2, closed loop, 64 concurrent requests of 16 random
prompt tokens and 64 output tokens (ignore_eos, temperature 0), it measures
in turn:

  (a) this service, Generate (unary)            output tok/s
  (b) this service, GenerateStream              tok/s, TTFT p50; by default
      (a delta per engine step, with text) and tuned (StreamOptions:
      --tuned-delta-tokens tokens per delta, omit_text)
  (c) the thinnest gRPC front end on the same engine (benchmarks.thin_front:
      raw bytes, none of this service's code), unary, streamed and tuned:
      the ceiling for this service's own layer that is not our code
  (d) the same AsyncLLM in-process, FINAL_ONLY  tok/s; DELTA, default and
      tuned, for the streams
  (e) `vllm serve`, /v1/completions over HTTP   tok/s

and prints the ratios against their targets, and the CPU seconds per 1,000
output tokens of the server's front-end process (this service; `vllm
serve`'s API server; the in-process run's one process), of its engine
processes, and of the load client: machine-independent figures of what each
layer costs, and the front end's ceiling (the tok/s one core of it carries).
`--profile` splits this service's front-end CPU by component (py-spy; see
benchmarks.profile_split). Every load runs
in a fresh process (benchmarks.drive). Every configuration gets the
same CPU placement: by default (`--placement pinned`) its processes other
than vLLM's worker run on the cores the worker is not bound to, as
`rollout-service serve` places itself; `--placement floating` leaves them
where the OS puts them (`serve --no-cpu-placement`). `vllm serve` is the
exception: it runs as its users run it, since pinned its API server starves
beside its spinning engine core (`--pin-serve` pins it anyway). The load client is not
placed. Run-to-run spread on this machine is wide, so `--rounds N` measures
every configuration N times, interleaved, and the ratios are medians. Every
engine gets the same environment (ENGINE_ENV) and the same engine arguments (ENGINE_ARGS, explicit
because vLLM picks different batch defaults for its OpenAI server). The
service always returns the sampled tokens' logprobs, so by default the other
configurations compute them too (`--serve-logprobs none` drops them for
`vllm serve`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.loadgen import (
    Range,
    Record,
    add_closed_loop_args,
    closed_loop_spec,
    format_summary,
    machine_ticks,
    steal_percent,
    tree_cpu_seconds,
)
from benchmarks.profile_split import format_split
from harness.serverproc import TEST_ENGINE_ENV, ServerProcess, free_port
from rollout_service.engine import placement

MODEL = "tiny-qwen2"
# Identical for every configuration: the test server's environment plus the
# KV cache size `rollout-service serve` defaults to.
ENGINE_ENV = {**TEST_ENGINE_ENV, "VLLM_CPU_KVCACHE_SPACE": "1"}
ENGINE_ARGS = [
    "--max-model-len",
    "2048",
    "--max-num-seqs",
    "128",
    "--max-num-batched-tokens",
    "2048",
]

# (name, numerator, denominator, metric, comparison, target)
# fmt: off
TARGETS = [
    ("ours unary / in-process tok/s", "ours_unary", "inprocess_unary", "tok/s", ">=", 0.95),
    ("ours unary / vllm serve tok/s", "ours_unary", "vllm_serve", "tok/s", ">=", 1.1),
    ("ours stream / in-process tok/s", "ours_stream", "inprocess_stream", "tok/s", ">=", 0.9),
    ("ours stream / in-process TTFT p50", "ours_stream", "inprocess_stream", "ttft", "<=", 1.3),
    # Both sides with the same StreamOptions (--tuned-delta-tokens, omit_text).
    ("tuned stream / in-process tok/s", "ours_stream_tuned", "inprocess_stream_tuned", "tok/s",
     ">=", 0.9),
    ("tuned stream / in-process TTFT p50", "ours_stream_tuned", "inprocess_stream_tuned", "ttft",
     "<=", 1.3),
    # No target: the service's own layer, against the thinnest gRPC front end
    # on the same engine (what any Python gRPC server costs is in both).
    ("ours unary / thin gRPC tok/s", "ours_unary", "thin_unary", "tok/s", None, None),
    ("ours stream / thin gRPC tok/s", "ours_stream", "thin_stream", "tok/s", None, None),
    ("ours stream / thin gRPC TTFT p50", "ours_stream", "thin_stream", "ttft", None, None),
    ("tuned stream / thin gRPC tok/s", "ours_stream_tuned", "thin_stream_tuned", "tok/s", None,
     None),
    ("tuned stream / thin gRPC TTFT p50", "ours_stream_tuned", "thin_stream_tuned", "ttft", None,
     None),
    # No target: what a gRPC front end in another process costs on this machine.
    ("thin unary / in-process tok/s", "thin_unary", "inprocess_unary", "tok/s", None, None),
    ("thin stream / in-process tok/s", "thin_stream", "inprocess_stream", "tok/s", None, None),
    ("thin stream / in-process TTFT p50", "thin_stream", "inprocess_stream", "ttft", None, None),
    ("thin tuned / in-process tok/s", "thin_stream_tuned", "inprocess_stream_tuned", "tok/s", None,
     None),
    # No target: front-end CPU per token against in-process's (front end and
    # load client in one process there): what a host with cores to spare gets.
    ("ours unary / in-process front CPU", "ours_unary", "inprocess_unary", "front", None, None),
    ("ours stream / in-process front CPU", "ours_stream", "inprocess_stream", "front", None, None),
    ("tuned stream / in-process front CPU", "ours_stream_tuned", "inprocess_stream_tuned", "front",
     None, None),
    ("ours unary / thin gRPC front CPU", "ours_unary", "thin_unary", "front", None, None),
    ("ours stream / thin gRPC front CPU", "ours_stream", "thin_stream", "front", None, None),
    ("tuned stream / thin gRPC front CPU", "ours_stream_tuned", "thin_stream_tuned", "front", None,
     None),
    # No target: front-end CPU per engine CPU, against the thin front's. The
    # host's speed moved throughput by half between rounds of one run, and
    # CPU per token with it; this share stayed within a few percent.
    ("ours unary / thin front/engine CPU", "ours_unary", "thin_unary", "front/engine", None,
     None),
    ("ours stream / thin front/engine CPU", "ours_stream", "thin_stream", "front/engine", None,
     None),
    ("tuned stream / thin front/engine CPU", "ours_stream_tuned", "thin_stream_tuned",
     "front/engine", None, None),
    # No target: what CPU placement is worth (only with --only ...,floating).
    ("ours unary / floating tok/s", "ours_unary", "ours_floating_unary", "tok/s", None, None),
    ("ours stream / floating TTFT p50", "ours_stream", "ours_floating_stream", "ttft", None, None),
]
# fmt: on
CONFIGS = ("ours", "thin", "inprocess", "serve")
# Not run unless asked for (--only ours,floating,...): ours without CPU placement.
EXTRA_CONFIGS = ("floating",)


def engine_env() -> dict[str, str]:
    """The full environment every engine process gets (as ServerProcess builds it)."""
    return {**os.environ, **ENGINE_ENV}


def kill_tree(pid: int) -> None:
    """SIGKILL to a configuration's process and everything under it.

    Servers are not started in a session of their own (which would allow
    os.killpg): with the kernel's autogroup scheduling (on by default,
    /proc/sys/kernel/sched_autogroup_enabled) a new session is a new
    scheduling group that shares the CPUs with the load client's group as a
    whole. Measured on the thin front end, same harness, same loads: per-step
    streams ran at 881 tok/s in a session of its own and 3,113 in the
    harness's (BENCHMARKS.md, stop 20)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def place(args, root_pid: int) -> None:
    """Applies --placement to a running configuration's processes under
    ``root_pid`` (rollout-service places itself; this only checks it). The
    load client is not part of the system under test and is left alone."""
    if args.placement != "pinned":
        return
    placed = placement.keep_off_worker_cores(root_pid)
    rest = placed[1] if placed else set(os.sched_getaffinity(root_pid))
    if rest == set(os.sched_getaffinity(0)):
        raise RuntimeError("--placement pinned: found no vLLM worker bound to cores")
    print(f"placement: all but the vLLM worker on CPUs {sorted(rest)}", flush=True)


def placement_args(args) -> list[str]:
    return [] if args.placement == "pinned" else ["--no-cpu-placement"]


def report(name: str, summary: dict) -> dict:
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
    """One load through benchmarks.drive, in a fresh process (see its
    docstring for why), with the server's CPU seconds per 1,000 output tokens
    and the load client's, measured around it; `profile`: py-spy samples the
    server's front end during the measured window (benchmarks.profile_split)."""
    out = Path(tempfile.mkstemp(prefix="drive-", suffix=".json")[1])
    cmd = [
        sys.executable, "-m", "benchmarks.drive", driver, target, "--json", str(out),
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
        from benchmarks.profile_split import Profile

        time.sleep(args.warmup + 2)  # the drive's start-up, then its warm-up
        spy = Profile(server_pid, args.duration - 2)
    if load.wait() != 0:
        raise RuntimeError(f"benchmarks.drive failed ({load.returncode})")
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
    extra = ["--no-cpu-placement"] if floating else placement_args(args)
    server = ServerProcess("--model", MODEL, *ENGINE_ARGS, *extra, env=ENGINE_ENV)
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
            out[f"{prefix}_{kind}"] = report(f"{name} {call}, {load}", summary)
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


class EngineServer:
    """A configuration's server process, its output in a log file; it is
    started in the harness's session (see kill_tree). Subclasses give the
    command and `ready()`."""

    name = "server"

    def __init__(self, cmd: list[str], log_prefix: str):
        self.log = Path(tempfile.mkstemp(prefix=log_prefix, suffix=".log")[1])
        self._log_file = open(self.log, "wb")
        self.proc = subprocess.Popen(
            cmd, stdout=self._log_file, stderr=subprocess.STDOUT, env=engine_env()
        )

    def ready(self) -> bool:
        raise NotImplementedError

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}), see {self.log}")
            if self.ready():
                return
            time.sleep(1)
        raise RuntimeError(f"{self.name} not ready after {timeout}s, see {self.log}")

    def stop(self, timeout: float = 60) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                kill_tree(self.proc.pid)
                self.proc.wait()
        self._log_file.close()


def model_vocab(model_dir: Path) -> int:
    return json.loads((model_dir / "config.json").read_text())["vocab_size"]


class ThinServer(EngineServer):
    """benchmarks.thin_front, with the engine arguments and placement every
    configuration gets."""

    name = "thin front"

    def __init__(self, args):
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        cmd = [
            sys.executable, "-m", "benchmarks.thin_front", "--port", str(self.port),
            "--", "--model", MODEL, *ENGINE_ARGS, *placement_args(args),
        ]  # fmt: skip
        super().__init__(cmd, "thin-front-")

    def ready(self) -> bool:
        return b"thin front ready" in self.log.read_bytes()


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
            out[f"thin_{kind}"] = report(f"thin gRPC front end {call}, {load}", summary)
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
        f"inprocess_{mode}": report(
            f"in-process AsyncLLM {kinds[mode]}, {closed_loop_spec(args).describe()}", s
        )
        for mode, s in results.items()
    }


class HttpDriver:
    """One POST /v1/completions per call (prompt as token ids), aiohttp."""

    def __init__(self, url: str, temperature: float, logprobs: int | None):
        import aiohttp

        self.url, self.temperature, self.logprobs = url, temperature, logprobs
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=600),
        )

    async def __call__(self, prompt: list[int], max_tokens: int) -> Record:
        import aiohttp

        body = {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "ignore_eos": True,
        }
        if self.logprobs is not None:
            body["logprobs"] = self.logprobs
        rec = Record(start=time.perf_counter())
        try:
            async with self.session.post(self.url, json=body) as resp:
                data = await resp.json(content_type=None)
                if resp.status != 200:
                    rec.error = f"HTTP_{resp.status}"
                else:
                    rec.tokens = data["usage"]["completion_tokens"]
        except (aiohttp.ClientError, ValueError, KeyError) as e:
            rec.error = type(e).__name__
        rec.end = time.perf_counter()
        return rec

    async def close(self) -> None:
        await self.session.close()


class VllmServe(EngineServer):
    """`vllm serve` (through benchmarks.vllm_serve)."""

    name = "vllm serve"

    def __init__(self, model_dir: Path):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable, "-m", "benchmarks.vllm_serve", "serve", str(model_dir),
            "--served-model-name", MODEL, "--tokenizer", str(model_dir),
            "--host", "127.0.0.1", "--port", str(self.port),
            "--disable-uvicorn-access-log", *ENGINE_ARGS,
        ]  # fmt: skip
        super().__init__(cmd, "vllm-serve-")

    def ready(self) -> bool:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False


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
        return {"vllm_serve": report(f"vllm serve /v1/completions, {load}", summary)}
    finally:
        server.stop()


def metric(summary: dict, name: str) -> float | None:
    if name == "tok/s":
        return summary["output_tokens_per_s"]
    if name == "front":
        return summary.get("front_cpu_s_per_1k_tokens")
    if name == "front/engine":
        return front_per_engine(summary)
    return (summary.get(name) or {}).get("p50")


def front_per_engine(summary: dict) -> float | None:
    """Front-end CPU per engine CPU (both per token): what the front end
    costs in units of the engine's own work, which a faster or slower host
    moves alike."""
    front, engine = (summary.get(f"{k}_cpu_s_per_1k_tokens") for k in ("front", "engine"))
    return front / engine if front and engine else None


def judge(value: float | None, op: str | None, target: float | None) -> dict:
    if op is None:
        return {"target": "-", "met": None}
    ok = None if value is None else (value >= target if op == ">=" else value <= target)
    return {"target": f"{op} {target}", "met": ok}


def ratios(results: dict) -> list[dict]:
    rows = []
    for name, num, den, m, op, target in TARGETS:
        a, b = results.get(num), results.get(den)
        if not (a and b):
            continue
        value = metric(a, m) / metric(b, m) if metric(a, m) and metric(b, m) else None
        rows.append({"ratio": name, "value": value, **judge(value, op, target)})
    return rows


def table(results: dict, rows: list[dict]) -> str:
    """The final comparison, configurations first, then the ratios."""
    lines = [
        "",
        f"{'configuration':<22} {'tok/s':>9} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'TTFT p50':>9} {'errors':>6}   CPU s per 1k output tokens: front engine client"
        "   front-end ceiling tok/s   front/engine   steal %",
    ]
    for key, s in results.items():
        nan = float("nan")
        lat, ttft = s["latency"] or {}, s.get("ttft") or {}
        p50, p99 = lat.get("p50", nan) * 1000, lat.get("p99", nan) * 1000
        ttft_ms = f"{ttft['p50'] * 1000:9.1f}" if ttft else f"{'-':>9}"
        keys = ("front", "engine", "client")
        per_k = [s.get(f"{k}_cpu_s_per_1k_tokens") for k in keys]
        cpu = " ".join("-" if v is None else f"{v:.3f}" for v in per_k)
        # What one core of front end can carry at this cost per token (the
        # throughput of a host whose engine and client are elsewhere).
        ceiling = f"{1000 / per_k[0]:,.0f}" if per_k[0] else "-"
        share = front_per_engine(s)
        share = "-" if share is None else f"{share:.3f}"
        steal = s.get("steal_percent")
        steal = "-" if steal is None else f"{steal:.1f}"
        lines.append(
            f"{key:<22} {s['output_tokens_per_s']:9,.0f} {s['requests_per_s']:7.1f} "
            f"{p50:8.1f} {p99:8.1f} {ttft_ms} {sum(s['errors'].values()):>6}   {cpu:<20} "
            f"{ceiling:>9} {share:>14} {steal:>9}"
        )
    return "\n".join([*lines, "", *ratio_lines(rows)])


def ratio_lines(rows: list[dict], column: str = "value") -> list[str]:
    """Ratio rows against their targets; medians also list every round's value."""
    lines = [
        f"{'ratio':<36} {column:>7}  {'target':<8} met" + ("  rounds" if column == "median" else "")
    ]
    for r in rows:
        value = "n/a" if r["value"] is None else f"{r['value']:.3f}"
        met = {True: "yes", False: "NO", None: "-"}[r["met"]]
        each = ", ".join(f"{v:.2f}" for v in r.get("rounds", ()))
        lines.append(f"{r['ratio']:<36} {value:>7}  {r['target']:<8} {met:<4} {each}".rstrip())
    return lines


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.compare",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
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
    ap.add_argument(
        "--only", default=",".join(CONFIGS), help="of " + ",".join(CONFIGS + EXTRA_CONFIGS)
    )
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    return ap


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


def median_rows(rounds: list[list[dict]]) -> list[dict]:
    """Per ratio: the median over rounds, with every round's value."""
    rows = []
    for name, _, _, _, op, target in TARGETS:
        per_round = [row for r in rounds for row in r if row["ratio"] == name]
        values = [row["value"] for row in per_round if row["value"] is not None]
        if not per_round:
            continue
        value = statistics.median(values) if values else None
        rows.append({"ratio": name, "value": value, **judge(value, op, target), "rounds": values})
    return rows


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rollout_service.engine.tiny_models import ensure_model

    model_dir = ensure_model(MODEL)
    only = args.only.split(",")
    rounds = []
    for n in range(1, args.rounds + 1):
        print(f"\n######## round {n} of {args.rounds}", flush=True)
        results = run_round(args, model_dir, only)
        rows = ratios(results)
        print(table(results, rows), flush=True)
        rounds.append({"results": results, "ratios": rows})
    final = median_rows([r["ratios"] for r in rounds])
    if args.rounds > 1:
        print(f"\n######## medians over {args.rounds} rounds")
        print("\n".join(ratio_lines(final, column="median")))
    if args.json:
        config = {k: str(v) if isinstance(v, (Range, Path)) else v for k, v in vars(args).items()}
        config.update(engine_env=ENGINE_ENV, engine_args=ENGINE_ARGS, model=MODEL)
        out = {"config": config, "rounds": rounds, "ratios": final}
        args.json.write_text(json.dumps(out, indent=2))
        print(f"wrote {args.json}")
    errors = sum(sum(s["errors"].values()) for r in rounds for s in r["results"].values())
    missed = args.check and any(r["met"] is False for r in final)
    return 1 if errors or missed else 0


if __name__ == "__main__":
    sys.exit(main())
