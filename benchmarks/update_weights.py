"""UpdateWeights throughput against the raw grpc.aio byte-stream ceiling.

Builds a larger random Qwen2 locally (about 300 MB of bf16 weights), starts
the real server on it and a sink server that receives the same
UpdateWeights stream over the same kind of grpc.aio channel and discards it.
Then pushes the same tensors, with the same client code, alternately to both,
and prints the ratio, the bytes per second and the atomic apply-plus-reset
time. Run with nothing else on the machine:

    .venv/bin/python -m benchmarks.update_weights [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rollout_client import RolloutClient
from rollout_client.weights import prepare_tensors
from rollout_service.tiny_models import ensure_model
from tests.serverproc import ServerProcess, free_port
from tests.weights_util import random_weights

BIG = dict(
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=2,
    vocab_size=32768,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)


def build_big_model(dest: Path) -> Path:
    """A ~150 M-parameter random Qwen2 with the tiny model's tokenizer."""
    if (dest / "config.json").exists():
        return dest
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tiny = ensure_model("tiny-qwen2")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    eos = json.loads((tiny / "config.json").read_text())["eos_token_id"]
    torch.manual_seed(0)
    config = Qwen2Config(**BIG, bos_token_id=eos, eos_token_id=eos, torch_dtype="bfloat16")
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(tmp)
    for f in tiny.iterdir():
        if "token" in f.name or f.name.endswith(".jinja") or f.name == "generation_config.json":
            shutil.copy(f, tmp / f.name)
    tmp.rename(dest)
    return dest


def push(target: str, tensors, version: str):
    import grpc

    from rollout.v1 import rollout_pb2_grpc
    from rollout_client.client import _channel_options
    from rollout_client.weights import iter_update_requests

    with grpc.insecure_channel(target, options=_channel_options(64 << 20)) as ch:
        stub = rollout_pb2_grpc.RolloutServiceStub(ch)
        t0 = time.perf_counter()
        ack = stub.UpdateWeights(iter_update_requests(tensors, version), timeout=600)
        return time.perf_counter() - t0, ack


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--model",
        default="qwen2-150m",
        help="qwen2-150m (built locally, ~300 MB) or an embedded name such as tiny-qwen2",
    )
    ap.add_argument(
        "--no-cpu-placement", action="store_true", help="pass it to the server (see placement.py)"
    )
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/rollout-service/bench"))
    args = ap.parse_args()

    if args.model == "qwen2-150m":
        model_dir = build_big_model(Path(args.cache) / "qwen2-150m")
    else:
        model_dir = ensure_model(args.model)
    extra = ["--no-cpu-placement"] if args.no_cpu_placement else []
    server = ServerProcess("--model", str(model_dir), "--max-model-len", "512", *extra)
    sink_port = free_port()
    sink = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.sink_server", "--port", str(sink_port)]
    )
    try:
        server.wait_ready()
        with RolloutClient(server.target) as c:
            info = c.server_info()
        tensors = prepare_tensors(random_weights(info.parameters, seed=1), info.parameters)
        total = sum(t.nbytes for t in tensors)
        print(f"model: {len(tensors)} tensors, {total / 1e6:.1f} MB bf16")
        sink_target = f"127.0.0.1:{sink_port}"
        RolloutClient(sink_target).wait_until_ready(60)
        push(sink_target, tensors, "warm")  # warm both paths once
        push(server.target, tensors, "warm-up")
        raw, full, apply_reset, receive = [], [], [], []
        for i in range(args.rounds):
            raw.append(push(sink_target, tensors, f"raw-{i}")[0])
            seconds, ack = push(server.target, tensors, f"bench-{i}")
            full.append(seconds)
            apply_reset.append(ack.timings.admission_closed_seconds)
            receive.append(ack.timings.receive_seconds)
        raw_s, full_s = statistics.median(raw), statistics.median(full)
        print(f"raw grpc.aio ceiling : {total / raw_s / 1e9:.2f} GB/s (median of {args.rounds})")
        print(f"UpdateWeights        : {total / full_s / 1e9:.2f} GB/s end to end")
        print(f"ratio                : {raw_s / full_s:.2f} of the ceiling (target >= 0.80)")
        print(f"receive phase alone  : {raw_s / statistics.median(receive):.2f} of the ceiling")
        print(
            f"apply+reset (atomic) : p50 {statistics.median(apply_reset) * 1000:.1f} ms, "
            f"max {max(apply_reset) * 1000:.1f} ms"
        )
    finally:
        sink.terminate()
        sink.wait()
        server.stop()


if __name__ == "__main__":
    main()
