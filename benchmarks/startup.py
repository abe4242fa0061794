"""What a start costs: `rollout-service serve` on the embedded model, started
`--rounds` times per side, the sides taking turns, each start stopped once
SERVING. Per start: seconds from the command to SERVING (the server's health
says so), and the CPU seconds every process of the server's tree used until
then (read from /proc while it starts), summed by role: the server, vLLM's
engine core, its worker, and the rest (compilers, the resource tracker).

Sides:
- forked: the server as it starts by default: its engine core starts from a
  copy of the server forked ahead (rollout_service/engine/core_fork.py), its
  worker is forked by the engine core (worker_fork.py);
- spawned: `VLLM_WORKER_MULTIPROC_METHOD=spawn` in its environment: each
  engine process a fresh interpreter, as vLLM's CPU platform starts them.

Medians per side, and forked over spawned. Run it with nothing else running:

    .venv/bin/python -m benchmarks.startup
    .venv/bin/python -m benchmarks.startup --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import psutil

from harness.serverproc import ServerProcess
from rollout_client import RolloutClient

SIDES = {"forked": {}, "spawned": {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}}
ROLES = ("server", "engine core", "worker", "other")


def _role(proc: psutil.Process, root: int) -> str:
    if proc.pid == root:
        return "server"
    title = " ".join(proc.cmdline())
    if "EngineCore" in title or "engine core" in title:
        return "engine core"
    return "worker" if "Worker" in title else "other"


def one_start(env: dict[str, str]) -> dict[str, float]:
    """One start to SERVING: its seconds and CPU seconds by role."""
    began = time.monotonic()
    server = ServerProcess(env=env)
    root = psutil.Process(server.proc.pid)
    cpu: dict[int, tuple[str, float]] = {}
    try:
        with RolloutClient(server.target) as client:
            while True:
                for proc in [root, *root.children(recursive=True)]:
                    try:
                        t = proc.cpu_times()
                        cpu[proc.pid] = (_role(proc, root.pid), t.user + t.system)
                    except psutil.Error:  # gone meanwhile: its last reading stays
                        pass
                if server.proc.poll() is not None:
                    raise RuntimeError(f"the server exited:\n{server.tail()}")
                try:
                    client.wait_until_ready(timeout=0.2)
                    break
                except TimeoutError:
                    pass
        result = {"seconds": time.monotonic() - began}
        for role in ROLES:
            result[role] = sum(s for r, s in cpu.values() if r == role)
        result["cpu"] = sum(result[role] for role in ROLES)
        return result
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for n in range(args.rounds):
        for side in list(SIDES) if n % 2 == 0 else list(SIDES)[::-1]:
            r = one_start(SIDES[side])
            runs[side].append(r)
            by_role = " / ".join(f"{r[role]:.1f}" for role in ROLES)
            print(
                f"round {n + 1} {side:8s} SERVING in {r['seconds']:5.1f} s, "
                f"CPU {r['cpu']:5.1f} s ({by_role})",
                flush=True,
            )
    med = {
        side: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for side, rs in runs.items()
    }
    print(f"\nmedians ({' / '.join(ROLES)}):")
    for side, m in med.items():
        by_role = " / ".join(f"{m[role]:.1f}" for role in ROLES)
        print(f"  {side:8s} SERVING in {m['seconds']:5.1f} s, CPU {m['cpu']:5.1f} s ({by_role})")
    f, s = med["forked"], med["spawned"]
    print(
        f"forked/spawned: time to SERVING {f['seconds'] / s['seconds']:.2f}x, "
        f"CPU {f['cpu'] / s['cpu']:.2f}x, "
        f"engine core CPU {f['engine core'] / s['engine core']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
