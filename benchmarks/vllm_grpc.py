"""This service against vLLM's own gRPC front (`vllm serve --grpc`), both up
at once, their loads alternating in one run.

`vllm serve --grpc` serves AsyncLLM through smg's VllmEngineServicer (the
`bench` extra installs it, pinned): one server-streaming Generate over token
ids, no text (smg's router detokenizes; its servicer asks vLLM for
detokenize=False). Both servers get benchmarks.lib.compare_servers' engine
arguments and environment; ours places itself as `rollout-service serve`
does, vLLM's runs as its users run it (`--pin-serve` places it too). Loads,
each the same closed loop on both sides (benchmarks.lib.drive, a fresh process
per window, the server's CPU read around it):

  unary  our Generate; vLLM's Generate with stream=false
  ids    our GenerateStream with omit_text (ids only); vLLM's streamed Generate
  text   our GenerateStream with text; vLLM's streamed Generate (ids: it has
         no text to send)

Both streams send a message per engine step (delta_tokens 0), both sides
return the sampled tokens' logprobs. Every round drives both sides in turn,
in reverse order every other round; each ratio is ours over vLLM's within
one round, then the median over rounds:

    .venv/bin/python -m benchmarks.vllm_grpc --rounds 3

compare's flags apply (`--duration`, `--concurrency`, `--rate`, `--serve-logprobs` for vLLM's
side, ...), except the stream options, which each load sets, and `--profile`.

It prints each window, then per load: output tok/s, the front end's CPU
seconds per 1,000 output tokens (the server's root process: gRPC, the
servicer, vLLM's output processing) and the process tree's (front end plus
engine core and worker), side by side, with ours / vLLM.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import uuid
from pathlib import Path

from benchmarks.ab import round_order
from benchmarks.lib import compare_runs, compare_servers
from benchmarks.lib.loadgen import Record, recorded
from harness.serverproc import LoggedServer, free_port

# load: (our driver, its stream flags, vLLM's driver)
LOADS = {
    "unary": ("grpc", [], "vgrpc"),
    "ids": ("grpc-stream", ["--omit-text"], "vgrpc-stream"),
    "text": ("grpc-stream", [], "vgrpc-stream"),
}
# (label, summary -> value): what each window prints and each ratio compares
FIGURES = (
    ("tok/s", lambda s: s["output_tokens_per_s"]),
    ("front CPU s/1k tok", lambda s: s["front_cpu_s_per_1k_tokens"]),
    (
        "tree CPU s/1k tok",
        lambda s: s["front_cpu_s_per_1k_tokens"] + s["engine_cpu_s_per_1k_tokens"],
    ),
)


class VllmGrpcServer(compare_servers.BaselineServer):
    """`vllm serve MODEL --grpc` (through benchmarks.lib.vllm_serve), ready when
    its health service answers SERVING (after the servicer's warm-up)."""

    name = "vllm serve --grpc"

    def __init__(self, model_dir: Path):
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        cmd = [
            sys.executable, "-m", "benchmarks.lib.vllm_serve", "serve", str(model_dir),
            "--grpc", "--served-model-name", compare_servers.MODEL,
            "--tokenizer", str(model_dir), "--host", "127.0.0.1", "--port", str(self.port),
            *compare_servers.ENGINE_ARGS,
        ]  # fmt: skip
        super().__init__(cmd, "vllm-grpc-")

    def ready(self) -> bool:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        with grpc.insecure_channel(self.target) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=2
                )
            except grpc.RpcError:
                return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING


class SmgDriver:
    """benchmarks.lib.loadgen's driver for vLLM's gRPC front: one Generate per
    call (token ids in, `stream` as asked), on one channel built as
    benchmarks.load builds ours."""

    def __init__(self, target: str, stream: bool, temperature: float, logprobs: int | None):
        from smg_grpc_proto import vllm_engine_pb2, vllm_engine_pb2_grpc

        from rollout_client.client import ConnectionOptions

        self.pb = vllm_engine_pb2
        self.stream, self.temperature, self.logprobs = stream, temperature, logprobs
        self.channel = ConnectionOptions().channel(target, aio=True, own_connection=True)
        self.stub = vllm_engine_pb2_grpc.VllmEngineStub(self.channel)

    def request(self, prompt: list[int], max_tokens: int):
        pb = self.pb
        params = pb.SamplingParams(
            temperature=self.temperature, max_tokens=max_tokens, ignore_eos=True
        )
        if self.logprobs is not None:
            params.logprobs = self.logprobs
        return pb.GenerateRequest(
            request_id=uuid.uuid4().hex,
            tokenized=pb.TokenizedInput(input_ids=prompt),
            sampling_params=params,
            stream=self.stream,
        )

    async def __call__(self, prompt: list[int], max_tokens: int) -> Record:
        request = self.request(prompt, max_tokens)
        with recorded() as rec:
            async for message in self.stub.Generate(request, timeout=600):
                # A stream's chunks carry its tokens; its closing `complete`
                # repeats the last chunk's. Unary: one `complete`, all of them.
                if message.HasField("chunk"):
                    rec.tokens_arrived(len(message.chunk.token_ids))
                elif not self.stream:
                    rec.tokens = len(message.complete.output_ids)
        return rec

    async def close(self) -> None:
        await self.channel.close()


def window_line(round_no: int, side: str, load: str, s: dict) -> str:
    cells = "  ".join(f"{label} {get(s):,.3f}" for label, get in FIGURES)
    errors = sum(s["errors"].values())
    return (
        f"round {round_no} {side:<5} {load:<5} {cells}  steal {s.get('steal_percent', 0):.1f}%  "
        f"errors {errors}"
    )


def report(windows: dict[tuple[str, str], list[dict]], loads: list[str]) -> str:
    """Per load and figure: each side's median over rounds, then ours / vLLM
    (the median of the per-round ratios, and each round's)."""
    lines = [f"{'load':<6}{'figure':<20}{'vLLM gRPC':>11}{'ours':>11}{'ours/vLLM':>11}   per round"]
    for load in loads:
        theirs, ours = windows[("vllm", load)], windows[("ours", load)]
        for label, get in FIGURES:
            per_round = [get(o) / get(t) for o, t in zip(ours, theirs)]
            lines.append(
                f"{load:<6}{label:<20}{statistics.median(map(get, theirs)):>11.3f}"
                f"{statistics.median(map(get, ours)):>11.3f}"
                f"{statistics.median(per_round):>11.3f}   "
                + ", ".join(f"{r:.2f}" for r in per_round)
            )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = compare_runs.run_parser("python -m benchmarks.vllm_grpc", __doc__)
    ap.add_argument("--loads", default=",".join(LOADS), help="of " + ",".join(LOADS))
    return ap


def drive(args, side: str, server, load: str, vocab: int) -> dict:
    ours_driver, flags, vllm_driver = LOADS[load]
    logprobs = None if args.serve_logprobs == "none" else int(args.serve_logprobs)
    if side == "ours":
        return compare_runs.drive(
            args, ours_driver, server.target, vocab, server.proc.pid, flags=flags
        )
    return compare_runs.drive(
        args, vllm_driver, server.target, vocab, server.proc.pid, logprobs=logprobs
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    loads = args.loads.split(",")
    if unknown := set(loads) - set(LOADS):
        raise SystemExit(f"unknown loads {sorted(unknown)}; of {', '.join(LOADS)}")
    from rollout_service.engine.tiny_models import ensure_model

    model_dir = ensure_model(compare_servers.MODEL)
    vocab = compare_servers.model_vocab(model_dir)
    servers: dict[str, LoggedServer] = {}
    try:
        # One after the other: two engines warming up at once only slow both.
        servers["vllm"] = VllmGrpcServer(model_dir)
        servers["vllm"].wait_ready()
        if args.pin_serve:
            compare_servers.place(args, servers["vllm"].proc.pid)
        servers["ours"] = compare_servers.rollout_server(args)
        servers["ours"].wait_ready()
        compare_servers.place(args, servers["ours"].proc.pid)
        for side, server in servers.items():
            print(f"{side}: {server.target} (log {server.log})", flush=True)
        windows: dict[tuple[str, str], list[dict]] = {}
        for n in range(1, args.rounds + 1):
            for load in loads:
                for side in round_order(list(servers), n):
                    s = drive(args, side, servers[side], load, vocab)
                    windows.setdefault((side, load), []).append(s)
                    print(window_line(n, side, load, s), flush=True)
        print(f"\nmedians over {args.rounds} rounds, ours / vLLM within each round")
        print(report(windows, loads))
        errors = sum(sum(s["errors"].values()) for w in windows.values() for s in w)
    finally:
        for server in servers.values():
            server.stop()
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
