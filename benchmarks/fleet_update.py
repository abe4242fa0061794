"""A fleet update (stage on every replica, then commit everywhere) against
one replica's update of the same weights, in one run:

    .venv/bin/python -m benchmarks.fleet_update [--rounds 3] [--replicas 2]

Two replicas of the locally built 310 MB model on this host; run it with
nothing else on the machine (each replica's vLLM worker wants a core)."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from benchmarks.lib.bigmodel import build_big_model
from harness.serverproc import ServerProcess
from rollout_client import RolloutClient
from rollout_client.fleet import Fleet


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/rollout-service/bench"))
    args = ap.parse_args()
    model_dir = build_big_model(Path(args.cache) / "qwen2-150m")
    path = str(next(model_dir.glob("*.safetensors")))
    servers = [
        ServerProcess("--model", str(model_dir), "--max-model-len", "512")
        for _ in range(args.replicas)
    ]
    try:
        for s in servers:
            s.wait_ready()
        one, fleet_s, apply_one, apply_fleet = [], [], [], []
        with RolloutClient(servers[0].target) as c, Fleet([s.target for s in servers]) as f:
            c.update_weights(path, "warm")
            f.update_weights(path, "warm-fleet")
            for r in range(args.rounds):
                t0 = time.perf_counter()
                ack = c.update_weights(path, f"one-{r}")
                one.append(time.perf_counter() - t0)
                apply_one.append(ack.timings.admission_closed_seconds)
                t0 = time.perf_counter()
                fa = f.update_weights(path, f"fleet-{r}")
                fleet_s.append(time.perf_counter() - t0)
                assert len(fa.acks) == args.replicas and not fa.dropped, fa
                apply_fleet.append(
                    max(a.timings.admission_closed_seconds for a in fa.acks.values())
                )
        med = statistics.median
        size = os.path.getsize(path) / 1e6
        print(f"\n{size:.0f} MB model, {args.replicas} replicas on one host, {args.rounds} rounds")
        print(f"one replica, one stream : {med(one):.3f} s (apply+reset {med(apply_one):.3f} s)")
        slowest = med(apply_fleet)
        print(f"fleet, barrier + commit : {med(fleet_s):.3f} s (slowest apply {slowest:.3f} s)")
        print(f"fleet / one replica     : {med(fleet_s) / med(one):.2f}x")
    finally:
        for s in servers:
            s.stop()


if __name__ == "__main__":
    main()
