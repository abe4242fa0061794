"""A front that is not gRPC drives the pipeline (pipeline/generations.py),
engine-free: the same caller slot, gate admission and served version as a
Generate, with nothing of gRPC imported, over an App whose engine is a
stand-in that answers every request with the same tokens."""

from __future__ import annotations

import asyncio

import pytest

from rollout.v1 import rollout_pb2 as pb
from rollout_service.fairness.identity import CallerId
from rollout_service.fairness.share import FairShare
from rollout_service.status.errors import FailedPrecondition, Unavailable
from tests.support.stand_in_pipeline import final_output, stand_in_pipeline

ANSWER = [7, 8, 9]


class StandInEngine:
    """Answers every prompt with ANSWER, in one final output."""

    errored = False

    def __init__(self) -> None:
        self.asked: list[tuple[list[int], str]] = []

    async def generate(self, prompt, params, request_id, **_):
        self.asked.append((prompt["prompt_token_ids"], request_id))
        yield final_output(ANSWER, prompt["prompt_token_ids"])


@pytest.fixture
def pipeline():
    """The pipeline over a stand-in App (the real gate, fair share and
    tokenizing thread; no tokenizer, no adapters) and its engine."""
    engine = StandInEngine()
    generations = stand_in_pipeline(engine, FairShare(True, {}, max_per_caller=4, seats=2))
    yield generations, engine
    generations.app.tokenizing.close()


def request(**fields) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        prompt_token_ids=[1, 2, 3],
        sampling_params=pb.SamplingParams(max_tokens=3),
        **fields,
    )


WHO = CallerId("a second front", "generate", "front")


def test_a_generation_runs_through_the_pipeline_without_grpc(pipeline):
    generations, engine = pipeline
    response = asyncio.run(generations.generate(request(request_id="r1"), WHO))
    assert list(response.completions[0].token_ids) == ANSWER
    assert response.weight_version == "v1"  # the gate's ticket
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (3, 3)
    [(prompt, engine_id)] = engine.asked
    assert prompt == [1, 2, 3] and engine_id.startswith("r1-")


def test_the_gate_admits_on_the_served_version_only(pipeline):
    generations, engine = pipeline
    with pytest.raises(FailedPrecondition, match="serves 'v1', not 'v2'"):
        asyncio.run(generations.generate(request(required_weight_version="v2"), WHO))
    assert engine.asked == []


def test_a_dead_engine_is_refused_before_any_work(pipeline):
    generations, engine = pipeline
    engine.errored = True
    with pytest.raises(Unavailable):
        asyncio.run(generations.generate(request(), WHO))
    assert engine.asked == []
