"""benchmarks.lib.profile_split charges py-spy samples to the component a user
would blame (the benchmark's by-component figures)."""

from benchmarks.lib.profile_split import NATIVE, component_of, split

ROOT = "<module> (rollout-service:8);main (rollout_service/cli.py:190);run (asyncio/runners.py:190)"
LOOP = (
    ROOT
    + ";BaseEventLoop._run_once (asyncio/base_events.py:1922);Handle._run (asyncio/events.py:80)"
)


def test_innermost_claimed_frame_wins_and_roots_are_skipped():
    ours = LOOP + ";RolloutServicer._stream (rollout_service/rpc/servicer.py:190)"
    assert component_of(
        (ours + ";stream_delta_to_proto (rollout_service/generation/outputs.py:140)").split(";")
    ) == ("protobuf building (our conversion)")
    assert component_of(ours.split(";")) == "our servicer and handlers"
    vllm = (
        LOOP + ";output_handler (vllm/v1/engine/async_llm.py:862);Event.set (asyncio/locks.py:190)"
    )
    assert component_of(vllm.split(";")) == "vLLM output processing (detokenizer, logprobs)"
    # no claimed frame: gRPC's Cython under the loop's callback runner
    assert component_of(LOOP.split(";")) == NATIVE


def test_split_weighs_stacks_by_their_counts():
    raw = f"{LOOP} 3\n{LOOP};Histogram.observe (prometheus_client/metrics.py:681) 1\n"
    assert split(raw) == {NATIVE: 0.75, "metrics (prometheus, vLLM stat loggers)": 0.25}
