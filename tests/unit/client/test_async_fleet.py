"""AsyncFleet runs the Fleet's blocking calls on threads of its own: an async
trainer's calls run at once, not six at a time (asyncio's default pool on
two cores), without a server (the Fleet's calls are stood in for)."""

from __future__ import annotations

import asyncio
import threading

from rollout_client.fleet import AsyncFleet

# More than asyncio's default pool ever has (min(32, CPUs + 4)).
AT_ONCE = 40


def test_an_async_trainers_calls_run_at_once():
    async def main():
        async with AsyncFleet(["127.0.0.1:9", "127.0.0.1:10"], probe_seconds=None) as f:
            all_in = threading.Barrier(AT_ONCE, timeout=10)

            def generate(**kwargs):
                all_in.wait()  # breaks unless every call is running at the same time
                return kwargs["prompt_token_ids"]

            f.fleet.generate = generate  # type: ignore[method-assign]
            return await asyncio.gather(*(f.generate(prompt_token_ids=[i]) for i in range(AT_ONCE)))

    assert asyncio.run(main()) == [[i] for i in range(AT_ONCE)]
