"""Delta updates against full pushes of the same weights, in one run.

Simulated RL steps: an fp32 master copy of a bf16 model's weights, Adam
(torch.optim.Adam, random gradients ~N(0, 1e-3)) at each learning rate, the
bf16 weights pushed after every step, twice: by the delta client
(`update_weights(..., delta=True)`: each push the cheaper way by what its
earlier pushes measured, rollout_client/weights/delta_costs.py; `--mode always`: a
delta every time) and as a full update of the same bytes (another client),
both to the real server started on the model, over the chosen transports.
The `ways` column lists how each of the delta client's pushes went (d: a
delta, f: full). Over gRPC the delta client always pushes first: `order`
is what going second costs a full push by itself (full against full, the
same order, measured per row), and `x order` the ratio times it (what the
ratio would be with both pushes first). On the same host, where both push
in full with no copy kept, the order alternates each step instead (x order:
nan). After the full push the delta client's record names the full push's
version: the bytes are the same, so the next delta goes against it.

Per learning rate and transport it prints medians over the steps after the
first: the wire bytes as a share of the model, the client's encode time and
GB/s of model per core, the server's receive / decode / apply / reset
seconds (UpdateTimings), the delta's receive+decode against the full push's
receive (the phases besides the engine's apply and reset), end to end
against the full push, with and without the engine's apply (the same work
for both, vLLM's oneDNN repack on CPU, a copy on a GPU), the server's and
client's peak RSS, and the server's CPU seconds per GB of model received.
Two ceilings independent of this project's code, measured in the same run:
a bytes-only gRPC stream (benchmarks/lib/sink_server.py, raw 1 MiB messages, on
the server's cores) of the delta's wire bytes and of the model's, whose
ratio is what receiving a delta instead of the model could save on this
transport at best; and memcpy, one core, against which the decode's GB/s of
model stands. Run it with nothing else running:

    .venv/bin/python -m benchmarks.delta_sync [--model mid|2g] [--steps 4]
        [--lrs 1e-6,3e-6,1e-5] [--transports one,four,host] [--zstd]
        [--mode auto|always]

The client sends SPARSE_XOR8 (its default); `--zstd`: SPARSE_XOR16 in zstd
frames (PushedWeights(zstd=True)).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
import torch

from benchmarks.lib.bigmodel import BIG_2G_DIR, BIG_DIR, build_2g_model, build_big_model
from benchmarks.weight_sync import MiB, to_sink
from harness.serverproc import ServerProcess, free_port
from rollout_client import RolloutClient
from rollout_client.weights.delta_push import PushedWeights

TRANSPORTS = {"one": {}, "four": {"streams": 4}, "host": {"same_host": True}}


def load(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        out.update(load_file(f))
    return out


class Trainer:
    """fp32 master weights under Adam; `step()` returns the bf16 to push."""

    def __init__(self, start: dict[str, torch.Tensor], lr: float, seed: int) -> None:
        self.names = list(start)
        self.dtypes = {n: t.dtype for n, t in start.items()}
        self.params = [torch.nn.Parameter(start[n].float()) for n in self.names]
        self.opt = torch.optim.Adam(self.params, lr=lr)
        self.g = torch.Generator().manual_seed(seed)

    def step(self) -> dict[str, torch.Tensor]:
        for p in self.params:
            p.grad = torch.randn(p.shape, generator=self.g) * 1e-3
        self.opt.step()
        with torch.no_grad():
            return {n: p.to(self.dtypes[n]) for n, p in zip(self.names, self.params)}


class SignTrainer:
    """Steps of lr x sign(N(0, 1)) on fp32 master weights: Adam's first step
    (every later Adam step moves less, so it changes fewer bf16 values), at
    a quarter of Adam's memory (no moments): what fits beside the server
    for the 2 GB model on 24 GiB."""

    def __init__(self, start: dict[str, torch.Tensor], lr: float, seed: int) -> None:
        self.lr = lr
        self.dtypes = {n: t.dtype for n, t in start.items()}
        self.master = {n: t.float() for n, t in start.items()}
        self.g = torch.Generator().manual_seed(seed)

    def step(self) -> dict[str, torch.Tensor]:
        for t in self.master.values():
            t += self.lr * torch.randn(t.shape, generator=self.g).sign()
        return {n: t.to(self.dtypes[n]) for n, t in self.master.items()}


def sink_seconds(target: str, nbytes: int) -> float:
    """Seconds to stream `nbytes` as raw 1 MiB messages to the bytes-only sink."""
    pieces = [bytes(MiB)] * (nbytes // MiB) + ([bytes(nbytes % MiB)] if nbytes % MiB else [])
    return to_sink(target, pieces)


def memcpy_gbs(nbytes: int = 512 * MiB) -> float:
    """memcpy's GB/s on one core, out of cache (the median of 5)."""
    src = memoryview(bytearray(os.urandom(MiB) * (nbytes // MiB)))
    dst = memoryview(bytearray(nbytes))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        dst[:] = src  # a memoryview's slice assignment is a memcpy
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


# Pairs of full pushes that measure the order's effect, per row.
ORDER_PAIRS = 3


def run(
    target: str,
    sink: str,
    pid: int,
    start,
    lr: float,
    steps: int,
    how: dict,
    label: str,
    adam: bool,
    zstd: bool,
    mode: bool | str,
) -> dict:
    model_bytes = sum(t.numel() * t.element_size() for t in start.values())
    same_host = "same_host" in how
    trainer = (Trainer if adam else SignTrainer)(start, lr, seed=int(lr * 1e9))
    rows: dict[str, list[float]] = {}

    def add(k: str, v: float) -> None:
        rows.setdefault(k, []).append(v)

    cpu = psutil.Process(pid)
    with RolloutClient(target, timeout=1800) as dc, RolloutClient(target, timeout=1800) as fc:
        dc.pushed = PushedWeights(zstd=zstd)
        tag = f"{label}-{lr:g}-{os.getpid()}"
        fc.update_weights(start, f"{tag}-f0", **how)
        # The order's own effect: full pushes of the same bytes by the two
        # clients, in the steps' order (the second push of a pair measured
        # 1.02-1.24x the first here): `order` is the second over the first.
        for j in range(ORDER_PAIRS):
            t = time.perf_counter()
            dc.update_weights(start, f"{tag}-o{j}-d", **how)
            first = time.perf_counter() - t
            t = time.perf_counter()
            fc.update_weights(start, f"{tag}-o{j}-f", **how)
            add("order", (time.perf_counter() - t) / first)
        dc.update_weights(start, f"{tag}-d0", delta=mode, **how)  # a full push, recorded
        # On the same host both clients push in full with no copy kept: their
        # pushes are interchangeable, so the order alternates step by step
        # and its bias cancels in the median (`x order` does not apply).
        ways = ""
        for i in range(1, steps + 1):
            weights = trainer.step()

            def full_push(weights=weights, version=f"{tag}-f{i}"):
                t = time.perf_counter()
                f = fc.update_weights(weights, version, **how)
                return f, time.perf_counter() - t

            full_first = same_host and i % 2 == 0
            if full_first:
                f, f_e2e = full_push()
            c0 = cpu.cpu_times()
            t = time.perf_counter()
            d = dc.update_weights(weights, f"{tag}-d{i}", delta=mode, **how)
            d_e2e = time.perf_counter() - t
            c1 = cpu.cpu_times()
            if not full_first:
                f, f_e2e = full_push()
            # The same bytes are served: the delta client's record stands for
            # them (when it keeps one: not on the same host).
            if dc.pushed.version:
                dc.pushed.version = f.weight_version
            pushed = dc.pushed.costs.history[-1]
            ways += pushed.way[0]
            if i == 1:
                continue  # Adam's first step moves every value by lr: reported apart
            add("wire", d.bytes_received / model_bytes)
            add("d_receive", d.timings.receive_seconds)
            if pushed.way == "delta":
                add("encode_s", pushed.encode_seconds)
                add("encode_gbs", model_bytes / pushed.encode_seconds / 1e9)
                add("d_decode", d.timings.decode_seconds)
                add("decode_gbs", model_bytes / d.timings.decode_seconds / 1e9)
            add("d_apply", d.timings.apply_seconds)
            add("d_reset", d.timings.reset_seconds)
            add("f_receive", f.timings.receive_seconds)
            add("f_apply", f.timings.apply_seconds)
            add(
                "ratio_rdv",
                (d.timings.receive_seconds + d.timings.decode_seconds) / f.timings.receive_seconds,
            )
            add("d_e2e", d_e2e)
            add("f_e2e", f_e2e)
            add("ratio_e2e", d_e2e / f_e2e)
            # The engine's apply (vLLM's oneDNN repack on CPU, a copy on a
            # GPU) is the same work for both and varies by itself: apart.
            add(
                "ratio_e2e_na",
                (d_e2e - d.timings.apply_seconds) / (f_e2e - f.timings.apply_seconds),
            )
            srv = (c1.user + c1.system) - (c0.user + c0.system)
            add("srv_cpu_per_gb", srv / (model_bytes / 1e9))
            if not same_host:
                sink_d, sink_f = (
                    sink_seconds(sink, d.bytes_received),
                    sink_seconds(sink, model_bytes),
                )
                add("sink_d", sink_d)
                add("sink_f", sink_f)
                add("sink_ratio", sink_d / sink_f)
    out: dict = {k: statistics.median(v) for k, v in rows.items()}
    for k in ("encode_s", "encode_gbs", "d_decode", "decode_gbs"):
        out.setdefault(k, float("nan"))  # every step went full
    out["ways"] = ways
    out["ratio_vs_order"] = float("nan") if same_host else out["ratio_e2e"] * out["order"]
    out["server_rss_gb"] = peak_rss(pid) / 1e9
    out["client_peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    return out


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["mid", "2g"], default="mid")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--lrs", default="1e-6,3e-6,1e-5")
    ap.add_argument("--transports", default="one,four,host")
    ap.add_argument(
        "--trainer",
        choices=["adam", "sign"],
        default="adam",
        help="sign: lr x sign(noise) steps, no Adam moments (the 2 GB model on 24 GiB)",
    )
    ap.add_argument("--zstd", action="store_true", help="SPARSE_XOR16 in zstd frames")
    ap.add_argument(
        "--mode",
        choices=["auto", "always"],
        default="auto",
        help="auto: delta=True (the client picks the cheaper way); always: a delta every step",
    )
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/rollout-service/bench"))
    args = ap.parse_args()
    cache = Path(args.cache)
    model = (
        build_big_model(cache / BIG_DIR)
        if args.model == "mid"
        else build_2g_model(cache / BIG_2G_DIR)
    )
    start = load(model)
    nbytes = sum(t.numel() * t.element_size() for t in start.values())
    print(
        f"model {model.name}: {nbytes / 1e9:.2f} GB; trainer {args.trainer}; "
        f"steps 2..{args.steps} (step 1 apart); "
        f"{'SPARSE_XOR16 + zstd' if args.zstd else 'SPARSE_XOR8'}"
    )
    print(f"ceiling: memcpy {memcpy_gbs():.2f} GB/s (one core)")
    # Nothing here generates: the smallest batch the engine warms up with. On a
    # machine without AVX-512 (bf16 matmuls on torch's fallback) vLLM's warm-up
    # of the 2.2 GB model at its default batch did not end in 15 minutes; at
    # 256 tokens it took 4 min 20 s.
    server = ServerProcess(
        "--model",
        str(model),
        "--max-model-len",
        "256",
        "--max-num-batched-tokens",
        "256",
        "--max-num-seqs",
        "4",
    )
    sink_port = free_port()
    sink = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.lib.sink_server", "--port", str(sink_port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        sink_pid = int(sink.stdout.readline().split()[-1])
        server.wait_ready(timeout=900)
        pid = server.proc.pid
        # The sink receives on the cores the server receives on (placement.py).
        for t in psutil.Process(sink_pid).threads():
            os.sched_setaffinity(t.id, psutil.Process(pid).cpu_affinity())
        header = (
            "lr      transport  ways   wire%   enc s  enc GB/s  recv s  dec s  dec GB/s  apply s  "
            "reset s | full recv s  (recv+dec)/full recv | e2e s  full e2e s  ratio  "
            "order  x order  ratio w/o apply | "
            "srv CPU s/GB  srv RSS GB  cli RSS GB | sink s: delta  model  ratio"
        )
        print(header)
        for lr in [float(x) for x in args.lrs.split(",")]:
            for name in args.transports.split(","):
                how = TRANSPORTS[name]
                r = run(
                    server.target,
                    f"127.0.0.1:{sink_port}",
                    pid,
                    start,
                    lr,
                    args.steps,
                    how,
                    name,
                    args.trainer == "adam",
                    args.zstd,
                    True if args.mode == "auto" else "always",
                )
                print(
                    f"{lr:<7g} {name:<9}  {r['ways']:<5}  {100 * r['wire']:5.2f}  "
                    f"{r['encode_s']:6.3f}  "
                    f"{r['encode_gbs']:8.2f}  {r['d_receive']:6.3f}  {r['d_decode']:5.3f}  "
                    f"{r['decode_gbs']:8.2f}  {r['d_apply']:7.3f}  {r['d_reset']:7.3f} | "
                    f"{r['f_receive']:11.3f}  {r['ratio_rdv']:20.3f} | {r['d_e2e']:5.2f}  "
                    f"{r['f_e2e']:10.2f}  {r['ratio_e2e']:5.2f}  {r['order']:5.2f}  "
                    f"{r['ratio_vs_order']:7.2f}  {r['ratio_e2e_na']:15.2f} | "
                    f"{r['srv_cpu_per_gb']:12.2f}  "
                    f"{r['server_rss_gb']:10.2f}  {r['client_peak_rss_gb']:10.2f} | "
                    + (
                        f"{r['sink_d']:13.3f}  {r['sink_f']:5.3f}  {r['sink_ratio']:5.3f}"
                        if "sink_d" in r
                        else "(same host: memcpy)"
                    ),
                    flush=True,
                )
    finally:
        sink.terminate()
        server.stop()


if __name__ == "__main__":
    main()
