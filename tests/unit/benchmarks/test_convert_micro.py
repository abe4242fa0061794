"""benchmarks.convert_micro runs and prints a time for every conversion it
names (it is what BENCHMARKS.md quotes per-message costs from)."""

import re

from benchmarks.convert_micro import cases, main


def test_every_case_builds_a_message_the_service_would_send():
    built = {name: fn() for name, (fn, _) in cases().items()}
    delta = built["stream delta (1 token, spans)"]
    assert list(delta.token_ids) == [100] and delta.version_spans[0].count == 1
    assert pb_parses(built["stream delta, serialized"])
    assert len(built["unary completion (64 tokens)"].token_ids) == 64


def pb_parses(data: bytes) -> bool:
    from rollout.v1 import rollout_pb2 as pb

    return pb.GenerateStreamResponse.FromString(data).weight_version == "v1"


def test_it_prints_microseconds_per_case(capsys):
    assert main(["--number", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(cases())
    assert all(re.search(r"\d+\.\d\d µs$", line) for line in lines)
