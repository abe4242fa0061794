"""benchmarks.loadgen: `--rate` is an open loop (arrivals do not wait for a
slow server), the default a closed loop (they do)."""

import argparse
import asyncio
import time

from benchmarks.loadgen import (
    Range,
    Record,
    Workload,
    add_closed_loop_args,
    closed_loop_spec,
    run_load,
)


def spec_of(*flags):
    ap = argparse.ArgumentParser()
    add_closed_loop_args(ap)
    return closed_loop_spec(ap.parse_args([*flags, "--no-progress"]))


async def slow_server(prompt, max_tokens) -> Record:
    rec = Record(start=time.perf_counter())
    await asyncio.sleep(0.2)
    rec.tokens, rec.end = max_tokens, time.perf_counter()
    return rec


def issued(spec) -> int:
    workload = Workload(Range(4, 4), Range(8, 8), vocab_size=100)
    return len(asyncio.run(run_load(slow_server, workload, spec)).records)


def test_rate_flag_gives_an_open_loop_that_a_slow_server_does_not_slow():
    spec = spec_of("--rate", "60", "--duration", "0.5", "--warmup", "0")
    assert spec.rate == 60 and spec.concurrency is None
    assert "open loop, 60 req/s" in spec.describe()
    # 0.2 s per request: one closed-loop worker would issue 3 in 0.5 s
    assert issued(spec) >= 15


def test_default_is_a_closed_loop_bounded_by_its_concurrency():
    spec = spec_of("--concurrency", "1", "--duration", "0.5", "--warmup", "0")
    assert spec.rate is None and spec.concurrency == 1
    assert issued(spec) <= 3
