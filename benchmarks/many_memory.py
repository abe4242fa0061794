"""What one GenerateMany stream makes the server hold, against the same load
with the stream's token budget lifted (every generation at once, as before the
bound): the server's RSS growth and the wall time, side by side in one run.

The load is issue 24's: COUNT generations of TOKENS tokens with 20 top
logprobs on one stream whose client reads nothing until the engine is idle,
then reads everything. Every token must arrive.

    .venv/bin/python -m benchmarks.many_memory --count 384
"""

from __future__ import annotations

import argparse
import time

from harness.many_load import PeakRss, waiting_load
from harness.serverproc import ServerProcess
from rollout_client import RolloutClient

UNBOUNDED = str(10**12)  # --max-stream-tokens that never holds a generation back


def run(count: int, tokens: int, logprobs: int, flags: list[str]) -> dict[str, float]:
    """One server, one stream: tokens delivered, RSS growth (MiB), seconds."""
    proc = ServerProcess(*flags)
    try:
        proc.wait_ready()
        requests = waiting_load(count, tokens, logprobs)
        with PeakRss(proc.proc.pid) as rss, RolloutClient(proc.target, timeout=1800) as client:
            t0 = time.monotonic()
            responses = client.generate_many(iter(requests))
            first = next(responses)  # the stream is open; read nothing more until idle
            while client.server_info().engine_requests:
                time.sleep(0.1)
            got = sum(len(d.token_ids) for r in [first, *responses] for d in r.deltas)
            seconds = time.monotonic() - t0
        return {"tokens": got, "grew_mib": rss.grown_mib, "seconds": seconds}
    finally:
        proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=96)
    parser.add_argument("--tokens", type=int, default=1900)
    parser.add_argument("--logprobs", type=int, default=20)
    args = parser.parse_args()
    want = args.count * args.tokens
    sides = {
        "bounded (defaults)": [],
        "unbounded (all at once)": ["--max-stream-tokens", UNBOUNDED],
    }
    results = {name: run(args.count, args.tokens, args.logprobs, f) for name, f in sides.items()}
    print(f"{args.count} x {args.tokens} tokens, {args.logprobs} logprobs, reader waits")
    for name, r in results.items():
        print(
            f"{name:26s} tokens {r['tokens']:.0f}/{want}  server grew {r['grew_mib']:6.0f} MiB"
            f"  {r['seconds']:6.1f} s  {r['tokens'] / r['seconds']:7.0f} tok/s"
        )
    bounded, ceiling = results.values()
    print(
        f"bounded / unbounded: memory {bounded['grew_mib'] / ceiling['grew_mib']:.2f}x, "
        f"time {bounded['seconds'] / ceiling['seconds']:.2f}x"
    )


if __name__ == "__main__":
    main()
