"""The servers benchmarks.compare and benchmarks.ab start and measure, on one
engine configuration: this service (harness.serverproc's ServerProcess), the
thinnest gRPC front end (benchmarks.lib.thin_front) and `vllm serve`, with the
one CPU placement each gets and `vllm serve`'s HTTP load driver.

Every server runs over harness.serverproc's LoggedServer: one lifecycle
(a log file, a readiness wait, SIGTERM then kill) for tests and benchmarks.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.lib.loadgen import Record
from harness.serverproc import TEST_ENGINE_ENV, LoggedServer, ServerProcess, free_port
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


def model_vocab(model_dir: Path) -> int:
    return json.loads((model_dir / "config.json").read_text())["vocab_size"]


def rollout_server(
    args, floating: bool = False, env: dict[str, str] | None = None, flags: Sequence[str] = ()
) -> ServerProcess:
    """This service on the shared engine configuration. ``floating``: started
    with --no-cpu-placement, whatever --placement says; ``env`` adds to the
    engine environment; ``flags``: the service's own flags."""
    extra = ["--no-cpu-placement"] if floating else placement_args(args)
    return ServerProcess(
        "--model", MODEL, *ENGINE_ARGS, *extra, *flags, env={**ENGINE_ENV, **(env or {})}
    )


class BaselineServer(LoggedServer):
    """A server this service is measured against, on the engine environment
    every configuration gets; it is started in the harness's session and
    killed as a tree past its stop's deadline (see kill_tree)."""

    def __init__(self, cmd: list[str], log_prefix: str):
        super().__init__(cmd, env=ENGINE_ENV, log_prefix=log_prefix)

    def kill(self) -> None:
        kill_tree(self.proc.pid)


class ThinServer(BaselineServer):
    """benchmarks.lib.thin_front, with the engine arguments and placement every
    configuration gets."""

    name = "thin front"

    def __init__(self, args):
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        cmd = [
            sys.executable, "-m", "benchmarks.lib.thin_front", "--port", str(self.port),
            "--", "--model", MODEL, *ENGINE_ARGS, *placement_args(args),
        ]  # fmt: skip
        super().__init__(cmd, "thin-front-")

    def ready(self) -> bool:
        return b"thin front ready" in self.log.read_bytes()


class VllmServe(BaselineServer):
    """`vllm serve` (through benchmarks.lib.vllm_serve)."""

    name = "vllm serve"

    def __init__(self, model_dir: Path, flags: Sequence[str] = ()):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable, "-m", "benchmarks.lib.vllm_serve", "serve", str(model_dir),
            "--served-model-name", MODEL, "--tokenizer", str(model_dir),
            "--host", "127.0.0.1", "--port", str(self.port),
            "--disable-uvicorn-access-log", *ENGINE_ARGS, *flags,
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


class HttpDriver:
    """`vllm serve`'s load: one POST /v1/completions per call (prompt as
    token ids), aiohttp."""

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
