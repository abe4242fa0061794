"""Weight sync against ceilings that are not our code, in one run.

Builds a ~300 MB random bf16 Qwen2 locally (its safetensors file is what
the trainer pushes), starts the real server on it, a server on the embedded
tiny model (for the apply+reset time), and a bytes-only gRPC sink. Then,
round after round, interleaved:

- ceiling: a sync gRPC client streams the file's bytes, already in memory,
  as 1 MiB raw messages (no protobuf, no project code) to the sink;
- memcpy: the same bytes copied into a warm buffer;
- `RolloutClient.update_weights(path)` in a fresh process: one stream, four
  parallel upload streams, and the same-host handoff;
- a full update of the embedded tiny model (its apply+reset).

Prints medians, ratios to the ceiling, the client's peak RSS over its RSS
after imports, and the server's CPU seconds per GB received. Run it with
nothing else on the machine:

    .venv/bin/python -m benchmarks.weight_sync [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

from benchmarks.lib.bigmodel import build_big_model
from harness.serverproc import ServerProcess, free_port
from harness.weights_util import random_weights

MiB = 1 << 20


def ceiling(target: str, data: memoryview, chunk: int = MiB) -> float:
    """Seconds to stream `data` as raw 1 MiB messages to the sink."""
    return to_sink(target, [bytes(data[i : i + chunk]) for i in range(0, len(data), chunk)])


def to_sink(target: str, pieces: list[bytes]) -> float:
    """Seconds to stream `pieces` as raw messages to the sink (after a
    warm-up of its first four)."""
    import grpc

    with grpc.insecure_channel(target, options=[("grpc.max_send_message_length", 64 * MiB)]) as ch:
        call = ch.stream_unary("/sink.Sink/Bytes", request_serializer=None)
        call(iter(pieces[:4]), timeout=60)  # connect and warm
        t0 = time.perf_counter()
        call(iter(pieces), timeout=600)
        return time.perf_counter() - t0


def memcpy(data: memoryview) -> float:
    # A memoryview's slice assignment is a memcpy (bytearray's is not).
    buf = memoryview(bytearray(len(data)))
    buf[:] = data  # warm the destination
    t0 = time.perf_counter()
    buf[:] = data
    return time.perf_counter() - t0


def push(target: str, path: str, version: str, *extra: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.lib.push_client", target, path, version, *extra],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def cpu_seconds(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def largest_tensor(path: str) -> int:
    from rollout_codecs.sources import open_source

    return max(t.nbytes for t in open_source(path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/rollout-service/bench"))
    ap.add_argument(
        "--no-cpu-placement",
        action="store_true",
        help="let the server (and the sink) use every core, the vLLM worker's too",
    )
    args = ap.parse_args()

    rows: dict[str, list] = {}
    cpu: dict[str, list] = {}

    def record(name: str, value) -> None:
        rows.setdefault(name, []).append(value)

    from rollout_client import RolloutClient

    # The embedded model's apply+reset first, on its own (one engine at a
    # time: an idle vLLM worker still takes a share of a core).
    tiny = ServerProcess()
    try:
        tiny.wait_ready()
        with RolloutClient(tiny.target) as c:
            weights = random_weights(c.server_info().parameters, seed=1)
            c.update_weights(weights, "warm")
            for r in range(max(args.rounds, 5)):
                ack = c.update_weights(weights, f"tiny-{r}")
                record("tiny apply+reset", ack.timings.admission_closed_seconds)
    finally:
        tiny.stop()

    model_dir = build_big_model(Path(args.cache) / "qwen2-150m")
    path = str(next(model_dir.glob("*.safetensors")))
    extra = ["--no-cpu-placement"] if args.no_cpu_placement else []
    big = ServerProcess("--model", str(model_dir), "--max-model-len", "512", *extra)
    sink_port = free_port()
    sink = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.lib.sink_server", "--port", str(sink_port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        sink_pid = int(sink.stdout.readline().split()[-1])
        big.wait_ready()
        # The sink receives on the cores the server receives on (the server
        # keeps off the vLLM worker's core, placement.py).
        cores = psutil.Process(big.proc.pid).cpu_affinity()
        for t in psutil.Process(sink_pid).threads():
            os.sched_setaffinity(t.id, cores)
        with open(path, "rb") as f:
            data = memoryview(f.read())
        sink_target = f"127.0.0.1:{sink_port}"
        push(big.target, path, "warm-up")
        for r in range(args.rounds):
            c0 = cpu_seconds(sink_pid)
            record("ceiling", ceiling(sink_target, data))
            cpu.setdefault("ceiling", []).append(cpu_seconds(sink_pid) - c0)
            record("memcpy", memcpy(data))
            for name, extra in (
                ("one stream", ()),
                ("4 streams", ("--streams", "4")),
                ("same host", ("--same-host",)),
            ):
                c0 = cpu_seconds(big.proc.pid)
                record(name, push(big.target, path, f"{name[:4]}-{r}", *extra))
                cpu.setdefault(name, []).append(cpu_seconds(big.proc.pid) - c0)
        report(rows, cpu, len(data), largest_tensor(path), args.rounds, cores)
    finally:
        sink.terminate()
        big.stop()


def report(rows, cpu, nbytes: int, largest: int, rounds: int, cores) -> None:
    med = statistics.median
    gb = nbytes / 1e9
    ceil_s = med(rows["ceiling"])
    flags = Path("/proc/cpuinfo").read_text()
    print(
        f"\nmodel file: {nbytes / 1e6:.1f} MB, largest tensor {largest / 1e6:.1f} MB; "
        f"{rounds} rounds, medians; avx512_bf16: {'avx512_bf16' in flags}"
    )
    print(f"{'':34} {'GB/s':>7} {'x ceiling':>10} {'server CPU s/GB':>16}")
    print(
        f"{'bytes-only gRPC ceiling (1 MiB)':34} {gb / ceil_s:7.2f} {1.0:10.2f} "
        f"{med(cpu['ceiling']) / gb:16.2f}"
    )
    print(f"{'memcpy into a warm buffer':34} {gb / med(rows['memcpy']):7.2f}")
    one = None
    for name in ("one stream", "4 streams", "same host"):
        runs = rows[name]
        recv = med(r["receive"] for r in runs)
        wall = med(r["wall"] for r in runs)
        apply_s = med(r["admission_closed"] for r in runs)
        cpu_gb = med(cpu[name]) / gb
        print(
            f"{name + ': receive phase':34} {gb / recv:7.2f} {ceil_s / recv:10.2f} {cpu_gb:16.2f}"
        )
        print(f"{name + ': end to end':34} {gb / wall:7.2f} {ceil_s / wall:10.2f}")
        print(
            f"{name + ': end to end - apply':34} {gb / (wall - apply_s):7.2f} "
            f"{ceil_s / (wall - apply_s):10.2f}   (apply+reset {apply_s * 1000:.0f} ms)"
        )
        if name == "one stream":
            one = recv
        else:
            print(f"{name + ': receive vs one stream':34} {one / recv:7.2f}x")
        over = med(r["peak_rss"] - r["rss_after_imports"] for r in runs)
        shm = med(r["rss_shmem"] for r in runs)
        print(
            f"{name + ': client peak RSS - after imports':34} {over / MiB:7.0f} MiB "
            f"(of it the server's region, mapped: {shm / MiB:.0f} MiB; "
            f"bound: largest tensor + 128 MiB = {(largest >> 20) + 128} MiB)"
        )
    tiny = rows["tiny apply+reset"]
    print(
        f"{'embedded model apply+reset':34} p50 {med(tiny) * 1000:.1f} ms, "
        f"max {max(tiny) * 1000:.1f} ms (target < 50 ms)"
    )


if __name__ == "__main__":
    main()
