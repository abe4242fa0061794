"""benchmarks.lib.loadgen: `--rate` is an open loop (arrivals do not wait for a
slow server), the default a closed loop (they do)."""

import argparse
import asyncio
import time

from benchmarks.lib.loadgen import (
    OneStreamDriver,
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


class FakeCall:
    """A bidi call whose replies the test scripts: one message per written
    request, naming it, after the next request has been written."""

    def __init__(self):
        self.written, self.replies = [], asyncio.Queue()

    async def write(self, message):
        self.written.append(message)

    async def done_writing(self):
        await self.replies.put(None)

    def __aiter__(self):
        return self

    async def __anext__(self):
        message = await self.replies.get()
        if message is None:
            raise StopAsyncIteration
        return message


class FakeChannel:
    async def close(self):
        pass


class ScriptedDriver(OneStreamDriver):
    def __init__(self):
        super().__init__(FakeChannel())
        self.fake = FakeCall()

    def open(self):
        return self.fake

    def request(self, tag, prompt, max_tokens):
        return (tag, max_tokens)

    def events(self, message):
        yield from message


def test_one_stream_driver_routes_each_event_to_its_call():
    async def run():
        d = ScriptedDriver()
        first = asyncio.create_task(d([1], 3))
        second = asyncio.create_task(d([2], 5))
        await asyncio.sleep(0)
        assert d.fake.written == [(0, 3), (1, 5)]  # one stream, tagged in order
        # one message speaks of both; the second ends first, the first fails
        await d.fake.replies.put([(0, 2, False, None), (1, 5, True, None)])
        await d.fake.replies.put([(0, 0, True, "code 3")])
        a, b = await first, await second
        await d.close()
        return a, b

    a, b = asyncio.run(run())
    assert (a.tokens, a.error, b.tokens, b.error) == (2, "code 3", 5, None)
    assert a.ttft is not None and b.ttft is not None and b.end <= a.end
