"""The per-message conversions of the hot paths, timed alone (no engine, no
gRPC): what one delta, one unary completion and one GenerateMany batch cost
to build in this process.

    .venv/bin/python -m benchmarks.convert_micro [--number N]

The figures are µs per call, best of five repeats. They say what a change to
convert.py, outputs.py or many.py saves per message; whether a load sees it is for
benchmarks.ab to say (BENCHMARKS.md, stop 23).
"""

from __future__ import annotations

import argparse
import timeit

from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput

from rollout.v1 import rollout_pb2 as pb
from rollout_service.generation import outputs


def delta_output(tokens: int = 1) -> CompletionOutput:
    ids = list(range(100, 100 + tokens))
    return CompletionOutput(
        index=0,
        text="abc" * tokens,
        token_ids=ids,
        cumulative_logprob=None,
        logprobs=[{t: Logprob(-1.25, 1, "abc")} for t in ids],
        finish_reason=None,
        stop_reason=None,
    )


def cases() -> dict:
    one, final = delta_output(1), delta_output(64)
    final.finish_reason = "length"

    def delta():
        spans = outputs.version_spans(None, 5, 1, "v1")
        return outputs.stream_delta_to_proto("req-abcdef-0123", one, 0, "v1", spans)

    def delta_serialized():
        return delta().SerializeToString()

    def completion():
        return outputs.completion_to_proto(final, 0, None, "v1")

    batch = [delta() for _ in range(8)]

    def many_batch_of_8():
        response = pb.GenerateManyResponse()
        response.deltas.extend(batch)
        return response.SerializeToString()

    return {
        "stream delta (1 token, spans)": (delta, 1),
        "stream delta, serialized": (delta_serialized, 1),
        "unary completion (64 tokens)": (completion, 1),
        "GenerateMany batch, per delta (8)": (many_batch_of_8, 8),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.convert_micro")
    ap.add_argument("--number", type=int, default=20000, help="calls per repeat")
    args = ap.parse_args(argv)
    for name, (fn, per) in cases().items():
        best = min(timeit.repeat(fn, number=args.number, repeat=5)) / args.number / per
        print(f"{name:<36} {best * 1e6:7.2f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
