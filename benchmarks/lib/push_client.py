"""One push in a fresh process, as a trainer would do it, reporting its wall
time and memory: `python -m benchmarks.lib.push_client TARGET PATH VERSION
[--streams N] [--same-host]` prints one JSON line.

Memory is the process's peak RSS above its RSS after the imports, the
figure the weight-sync issue bounds (largest tensor + 128 MiB)."""

from __future__ import annotations

import argparse
import json
import time


def status_bytes(field: str) -> int:
    """A size from /proc/self/status (VmRSS, VmHWM, RssShmem, ...)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("path")
    ap.add_argument("version")
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--same-host", action="store_true")
    ap.add_argument("--chunk-bytes", type=int, default=1 << 20)
    ap.add_argument(
        "--repeat",
        type=int,
        default=2,
        help="pushes in a row, as a trainer's steps (reported: the last)",
    )
    args = ap.parse_args()

    from rollout_client import RolloutClient

    after_imports = status_bytes("VmRSS")
    walls = []
    with RolloutClient(args.target) as client:
        for i in range(args.repeat):
            t0 = time.perf_counter()
            ack = client.update_weights(
                args.path,
                f"{args.version}-{i}",
                streams=args.streams,
                same_host=args.same_host,
                chunk_bytes=args.chunk_bytes,
            )
            walls.append(time.perf_counter() - t0)
        # Shared memory mapped now (the server's staging region, same-host
        # handoff): RSS, but not memory of the client's own.
        shmem = status_bytes("RssShmem")
    t = ack.timings
    print(
        json.dumps(
            dict(
                wall=walls[-1],
                first_wall=walls[0],
                bytes=ack.bytes_received,
                receive=t.receive_seconds,
                apply=t.apply_seconds,
                reset=t.reset_seconds,
                admission_closed=t.admission_closed_seconds,
                load=t.load_seconds,
                rss_after_imports=after_imports,
                # VmHWM: this process's own high-water mark (ru_maxrss would
                # carry the forking parent's peak across exec).
                peak_rss=status_bytes("VmHWM"),
                rss_shmem=shmem,
            )
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
