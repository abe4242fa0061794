"""The front's share of one engine step, engine-free: every running request
wakes on the same step, and another caller's first token goes out before
the deltas of a caller flooding the server (pipeline/generations.py's run,
fairness/share.py's gives_way), over a stand-in engine that steps all its
requests at once in the order they arrived, as vLLM's output handler does."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from rollout.v1 import rollout_pb2 as pb
from rollout_service.fairness.identity import CallerId
from rollout_service.fairness.share import FairShare
from rollout_service.pipeline.generations import Generations
from tests.support.stand_in_pipeline import stand_in_pipeline

TOKENS = 3


class SteppingEngine:
    """Each request gets one token an engine step; `step` makes it for all
    of them at once, waking them in the order they arrived."""

    errored = False

    def __init__(self) -> None:
        self.tick = asyncio.Event()
        self.waiting = 0
        self.arrived = asyncio.Condition()

    async def until_waiting(self, n: int) -> None:
        """Until `n` requests wait for the next step."""
        async with self.arrived:
            await self.arrived.wait_for(lambda: self.waiting >= n)

    async def generate(self, prompt, params, request_id, **_):
        for n in range(1, TOKENS + 1):
            tick = self.tick
            async with self.arrived:
                self.waiting += 1
                self.arrived.notify_all()
            await tick.wait()
            last = n == TOKENS
            completion = SimpleNamespace(
                index=0,
                token_ids=[n],
                logprobs=None,
                text="",
                finish_reason="length" if last else None,
                stop_reason=None,
                weight_versions=None,
                finished=lambda last=last: last,
            )
            yield SimpleNamespace(
                outputs=[completion],
                prompt_token_ids=prompt["prompt_token_ids"],
                prompt_logprobs=None,
                num_cached_tokens=0,
                finished=last,
            )

    def step(self) -> None:
        tick, self.tick, self.waiting = self.tick, asyncio.Event(), 0
        tick.set()

    async def abort(self, ids) -> None:
        pass


def _pipeline(fair: bool) -> tuple[Generations, SteppingEngine]:
    engine = SteppingEngine()
    return stand_in_pipeline(engine, FairShare(fair, {}, max_per_caller=None)), engine


def _stream(name: str) -> pb.GenerateStreamRequest:
    return pb.GenerateStreamRequest(
        request_id=name,
        prompt_token_ids=[1, 2, 3],
        sampling_params=pb.SamplingParams(max_tokens=TOKENS),
    )


async def _first_step_order(fair: bool, flood: int) -> list[str]:
    """Caller A's `flood` streams, then caller B's one, all running; the
    order in which their messages of one engine step reach the front."""
    generations, engine = _pipeline(fair)
    order: list[str] = []
    a = CallerId("A", "generate", "A")
    b = CallerId("B", "generate", "B")

    async def consume(name: str, who: CallerId) -> None:
        async for message in generations.stream(_stream(name), who):
            if message.token_ids:
                order.append(f"{name}:{message.token_ids[0]}")

    tasks = [asyncio.ensure_future(consume(f"a{i}", a)) for i in range(flood)]
    await engine.until_waiting(flood)
    tasks.append(asyncio.ensure_future(consume("b", b)))
    for _ in range(TOKENS):
        await engine.until_waiting(flood + 1)
        engine.step()
    await asyncio.gather(*tasks)
    generations.app.tokenizing.close()
    return order


def test_another_callers_first_token_goes_out_before_a_floods_deltas():
    order = asyncio.run(_first_step_order(fair=True, flood=6))
    first_step = order[:7]
    # a0 is within A's share (priority 0): it goes in arrival order; the
    # rest of A's flood gives way to B.
    assert first_step.index("b:1") <= 1, first_step
    assert sorted(first_step) == sorted([f"a{i}:1" for i in range(6)] + ["b:1"])
    assert len(order) == 7 * TOKENS, "every message of every stream still comes"


def test_first_come_first_served_keeps_the_engines_order():
    """With fair share off (--no-fair-share) the step's messages go in the
    order the engine made them: B's after A's whole flood."""
    order = asyncio.run(_first_step_order(fair=False, flood=6))
    assert order[:7] == [f"a{i}:1" for i in range(6)] + ["b:1"]


def test_one_caller_alone_never_waits_on_itself():
    fair = FairShare(True, {}, max_per_caller=None)
    with (
        fair.slot(CallerId("A", "generate", "A")) as first,
        fair.slot(CallerId("A", "generate", "A")) as second,
    ):
        assert (first.priority, second.priority) == (0, 1)
        assert not fair.gives_way(second), "no other caller: nothing to give way to"
        with fair.slot(CallerId("B", "generate", "B")) as other:
            assert fair.gives_way(second) and not fair.gives_way(first)
            assert not fair.gives_way(other)
