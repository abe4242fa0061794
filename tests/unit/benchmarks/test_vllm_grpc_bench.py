"""benchmarks.vllm_grpc: vLLM's gRPC front is asked what ours is asked (token
ids, greedy, ignore_eos, the sampled tokens' logprobs, streamed or not), and
every ratio is ours over vLLM's in the same round."""

import asyncio

import pytest

from benchmarks.vllm_grpc import SmgDriver, report


def window(tok_s, front, engine):
    return {
        "output_tokens_per_s": tok_s,
        "front_cpu_s_per_1k_tokens": front,
        "engine_cpu_s_per_1k_tokens": engine,
    }


def _requests(stream: bool) -> list:
    """Two requests of a driver built as the benchmark builds it: in its
    event loop (its channel is grpc.aio's)."""

    async def built() -> list:
        driver = SmgDriver("127.0.0.1:1", stream, temperature=0.0, logprobs=0)
        try:
            return [driver.request([11, 12, 13], 64), driver.request([11], 1)]
        finally:
            await driver.channel.close()

    return asyncio.run(built())


@pytest.mark.parametrize("stream", [False, True])
def test_vllm_is_asked_for_what_ours_is_asked(stream):
    request, other = _requests(stream)
    params = request.sampling_params
    assert list(request.tokenized.input_ids) == [11, 12, 13]
    assert request.stream is stream
    assert params.HasField("temperature") and params.temperature == 0.0
    assert params.max_tokens == 64 and params.ignore_eos
    assert params.HasField("logprobs") and params.logprobs == 0
    assert request.request_id != other.request_id


def test_ratios_are_ours_over_vllm_within_each_round():
    windows = {
        ("vllm", "ids"): [window(1000, 0.10, 0.20), window(500, 0.10, 0.10)],
        ("ours", "ids"): [window(2000, 0.05, 0.20), window(1000, 0.20, 0.10)],
    }
    rows = [line.split()[-5:] for line in report(windows, ["ids"]).splitlines()[1:]]
    # vLLM's median, ours, the median of the per-round ratios, then each round's
    assert rows == [
        ["750.000", "1500.000", "2.000", "2.00,", "2.00"],
        ["0.100", "0.125", "1.250", "0.50,", "2.00"],
        ["0.250", "0.275", "1.167", "0.83,", "1.50"],
    ]
