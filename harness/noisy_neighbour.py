"""The noisy-neighbour scenario of fair sharing, for tests and benchmarks.

Caller A submits `flood` unary Generate calls at once (`flood_tokens` each,
`ignore_eos`); `delay` seconds later caller B sends one greedy
`probe_tokens`-token call. B's latency is compared with its idle latency
(the same call on the idle server, the median of `idle_probes`), measured in
the same run. Callers are told apart by their clients' `token`s (auth on) or,
with auth off, by their `tenant`s (RolloutClient options).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rollout_client import AsyncRolloutClient


def client(target: str, options: dict[str, Any]) -> AsyncRolloutClient:
    """A caller's client: `options` are RolloutClient's (token, tenant, TLS)."""
    return AsyncRolloutClient(target, **{"timeout": 600, "retries": 0, **options})


@dataclass
class Outcome:
    idle_seconds: list[float]
    probe_seconds: float
    flood_ok: int
    flood_failed: list[str] = field(default_factory=list)
    flood_seconds: float = 0.0
    flood_tokens: int = 0
    # A's calls answered before B's was: B queued behind the flood waits
    # for nearly all of them (first come, first served), fairly for none.
    flood_done_before_probe: int = 0

    @property
    def idle(self) -> float:
        return statistics.median(self.idle_seconds)

    @property
    def ratio(self) -> float:
        return self.probe_seconds / self.idle


PROBE_PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]


async def probe(client: AsyncRolloutClient, tokens: int = 16) -> float:
    """Seconds of one greedy `tokens`-token call (B's)."""
    t0 = time.perf_counter()
    r = await client.generate(
        prompt_token_ids=PROBE_PROMPT, max_tokens=tokens, ignore_eos=True, temperature=0.0
    )
    assert len(r.completions[0].token_ids) == tokens
    return time.perf_counter() - t0


def flood(
    client: AsyncRolloutClient, n: int = 600, tokens: int = 256, done: list[float] | None = None
) -> asyncio.Future:
    """`n` unary calls of `tokens` sampled tokens each, sent at once (A's):
    a future of their results (token counts, or the exceptions); each call's
    end (perf_counter) is appended to `done`."""

    async def one(i: int) -> int:
        try:
            r = await client.generate(
                prompt_token_ids=[20 + i % 400, 21, 22, 23],
                max_tokens=tokens,
                ignore_eos=True,
                temperature=1.0,
            )
        finally:
            if done is not None:
                done.append(time.perf_counter())
        return len(r.completions[0].token_ids)

    return asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)


async def run(
    target: str,
    a: dict[str, Any],
    b: dict[str, Any],
    *,
    flood_calls: int = 600,
    flood_tokens: int = 256,
    probe_tokens: int = 16,
    delay: float = 3.0,
    idle_probes: int = 5,
    meanwhile: Callable[[AsyncRolloutClient], Awaitable[None]] | None = None,
    until: Callable[[], Awaitable[None]] | None = None,
) -> Outcome:
    """The scenario; `meanwhile(a's client)` runs beside it from the moment
    the flood is sent (a test's checks of the server under the flood). B's
    call goes `delay` seconds after the flood, or once `until()` returns."""
    async with client(target, a) as ca, client(target, b) as cb:
        await probe(cb, probe_tokens)  # warm
        idle = [await probe(cb, probe_tokens) for _ in range(idle_probes)]
        t0 = time.perf_counter()
        done: list[float] = []
        flooding = flood(ca, flood_calls, flood_tokens, done)
        checks = asyncio.ensure_future(meanwhile(ca)) if meanwhile is not None else None
        await (until() if until is not None else asyncio.sleep(delay))
        behind = await probe(cb, probe_tokens)
        done_before = len(done)
        results = await flooding
        if checks is not None:
            await checks
        seconds = time.perf_counter() - t0
    failed = [str(r) for r in results if isinstance(r, BaseException)]
    tokens = sum(r for r in results if isinstance(r, int))
    return Outcome(idle, behind, flood_calls - len(failed), failed, seconds, tokens, done_before)
