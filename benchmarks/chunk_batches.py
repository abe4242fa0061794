"""What TensorChunkBatch saves where messages, not bytes, take the time.

A delta that changes one bf16 word in every tensor of the mid-size model
(99 tensors: one tiny encoded tensor each), pushed to one real server over
one stream, alternately one message per chunk and batched (the client's
default where GetServerInfo.accepts_chunk_batches). Prints the medians of the
server's receive seconds (UpdateTimings.receive_seconds) and of the client's
end-to-end seconds, and the message count of each. Run it with nothing else
running:

    .venv/bin/python -m benchmarks.chunk_batches [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import grpc

from benchmarks.delta_sync import load
from benchmarks.lib.bigmodel import BIG_DIR, build_big_model
from harness.serverproc import ServerProcess
from rollout_client import RolloutClient
from rollout_client.weights import push


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/rollout-service/bench"))
    args = ap.parse_args()
    model = build_big_model(Path(args.cache) / BIG_DIR)
    weights = load(model)
    server = ServerProcess("--model", str(model), "--max-model-len", "512")
    try:
        server.wait_ready(timeout=900)
        with RolloutClient(server.target, timeout=600) as c:
            info = c.server_info()
            assert info.accepts_chunk_batches
            c.update_weights(weights, "chunk-batches-0", delta=True)  # in full, recorded
            pushed = c.pushed
            assert pushed is not None
            rows: dict[bool, dict[str, list[float]]] = {False: {}, True: {}}
            step = 0
            for _ in range(args.rounds):
                for batch in (False, True):
                    step += 1
                    for t in weights.values():
                        t.view(-1)[0] += 1e-2  # one word of every tensor
                    u = push.prepare(weights, f"chunk-batches-{step}", info.parameters)
                    u.batch_chunks = batch
                    d = pushed.delta(u)
                    messages = sum(1 for _ in push.groups(d.update, push.pieces(d.update)))
                    with grpc.insecure_channel(server.target) as ch:
                        t0 = time.perf_counter()
                        ack = push.one_stream(ch, d.update)
                        e2e = time.perf_counter() - t0
                    pushed.record_delta(d, ack.weight_version)
                    r = rows[batch]
                    r.setdefault("receive", []).append(ack.timings.receive_seconds)
                    r.setdefault("e2e", []).append(e2e)
                    r.setdefault("messages", []).append(messages)
        for batch in (False, True):
            r = {k: statistics.median(v) for k, v in rows[batch].items()}
            print(
                f"{'batched' if batch else 'one message per chunk':<22} "
                f"{int(r['messages']):4d} chunk messages  receive {r['receive'] * 1e3:7.2f} ms  "
                f"end to end {r['e2e'] * 1e3:7.1f} ms",
                flush=True,
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
