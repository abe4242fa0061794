"""The noisy-neighbour scenario of fair sharing, for tests and benchmarks.

Caller A floods the server (`flood`): `n` generations of `tokens` sampled
tokens each (`ignore_eos`), sent at once as one of `FLOODS`: unary Generate
calls, GenerateStream calls, one GenerateMany stream carrying them all, or a
streamed turn on each of `n` sessions. Meanwhile caller B probes the server:
a greedy `probe_tokens`-token call (`probe`), the first token of a stream
(`first_token`), GetServerInfo (`server_info`), and an Abort of a stream of
its own (`abort_lateness`). Each is compared with the same probe on the idle
server, measured in the same run. Callers are told apart by their clients'
`token`s (auth on) or, with auth off, by their `tenant`s (RolloutClient
options).
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rollout_client import AsyncRolloutClient, pb

# How A floods: the RPC its generations go through.
FLOODS = ("unary", "stream", "many", "session")


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


async def first_token(client: AsyncRolloutClient, tokens: int = 16) -> float:
    """Seconds from sending a greedy `tokens`-token GenerateStream (B's) to
    its first token; the rest of the stream is read to its end."""
    t0 = time.perf_counter()
    first = 0.0
    got = 0
    stream = client.generate_stream(
        prompt_token_ids=PROBE_PROMPT, max_tokens=tokens, ignore_eos=True, temperature=0.0
    )
    async for m in stream:
        if m.token_ids and not first:
            first = time.perf_counter() - t0
        got += len(m.token_ids)
    assert got == tokens, got
    return first


async def server_info(client: AsyncRolloutClient) -> float:
    """Seconds of one GetServerInfo."""
    t0 = time.perf_counter()
    await client.server_info()
    return time.perf_counter() - t0


@dataclass(frozen=True)
class Lateness:
    """One Abort of a running stream: how long the Abort call took, the
    tokens the stream still delivered after the Abort was sent and after it
    returned, the seconds from sending it to the stream's end, and how the
    stream ended (FINISH_REASON_ABORT, or LENGTH when the Abort came after
    the stream had run to its end)."""

    abort_seconds: float
    tokens_after_sent: int
    tokens_after_return: int
    end_seconds: float
    finish_reason: int


async def abort_lateness(
    client: AsyncRolloutClient, after_tokens: int = 32, max_tokens: int = 1500
) -> Lateness:
    """Starts a long greedy stream of `client`'s own, aborts it once
    `after_tokens` have arrived, and reads it to its end."""
    rid = f"abort-probe-{uuid.uuid4().hex[:8]}"
    stream = client.generate_stream(
        prompt_token_ids=PROBE_PROMPT,
        max_tokens=max_tokens,
        ignore_eos=True,
        temperature=0.0,
        request_id=rid,
        omit_text=True,
    )
    got = after_sent = after_return = reason = 0
    sent: list[float] = []
    returned: list[float] = []

    async def abort() -> None:
        sent.append(time.perf_counter())
        await client.abort(request_ids=[rid])
        returned.append(time.perf_counter())

    aborting: asyncio.Task | None = None
    async for m in stream:
        n = len(m.token_ids)
        got += n
        after_sent += n if aborting is not None else 0
        after_return += n if returned else 0
        reason = m.finish_reason or reason
        if aborting is None and got >= after_tokens:
            aborting = asyncio.ensure_future(abort())
    end = time.perf_counter()
    assert aborting is not None, f"the stream ended after {got} tokens, before its Abort"
    await aborting
    return Lateness(
        returned[0] - sent[0], after_sent, after_return, max(0.0, end - sent[0]), reason
    )


def _prompt(i: int) -> list[int]:
    return [20 + i % 400, 21, 22, 23]


async def _stream_tokens(stream) -> int:
    got = 0
    async for m in stream:
        got += len(m.token_ids)
    return got


async def _turn_tokens(s, tokens: int) -> int:
    got = 0
    async for m in s.generate_stream(
        max_tokens=tokens, ignore_eos=True, temperature=1.0, omit_text=True
    ):
        got += len(m.delta.token_ids)
    return got


def flood(
    client: AsyncRolloutClient,
    n: int = 600,
    tokens: int = 256,
    done: list[float] | None = None,
    kind: str = "unary",
) -> asyncio.Future:
    """`n` generations of `tokens` sampled tokens each, sent at once (A's)
    through `kind` (FLOODS): a future of their results (token counts, or the
    exceptions); each generation's end (perf_counter) is appended to `done`."""
    if kind == "many":
        return asyncio.ensure_future(_many(client, n, tokens, done))
    sampling = {"max_tokens": tokens, "ignore_eos": True, "temperature": 1.0}

    async def one(i: int) -> int:
        try:
            if kind == "unary":
                r = await client.generate(prompt_token_ids=_prompt(i), **sampling)  # type: ignore[arg-type]
                return len(r.completions[0].token_ids)
            if kind == "stream":
                stream = client.generate_stream(prompt_token_ids=_prompt(i), **sampling)  # type: ignore[arg-type]
                return await _stream_tokens(stream)
            if kind == "session":
                async with await client.open_session(prompt_token_ids=_prompt(i)) as s:
                    return await _turn_tokens(s, tokens)
            raise ValueError(f"flood kind {kind!r}: one of {FLOODS}")
        finally:
            if done is not None:
                done.append(time.perf_counter())

    return asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)


async def _many(
    client: AsyncRolloutClient, n: int, tokens: int, done: list[float] | None
) -> list[int | BaseException]:
    """A's `n` generations on one GenerateMany stream."""
    requests = [
        pb.GenerateStreamRequest(
            request_id=f"many-{i}",
            prompt_token_ids=_prompt(i),
            sampling_params=pb.SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=1.0),
        )
        for i in range(n)
    ]
    got: dict[str, int | BaseException] = {r.request_id: 0 for r in requests}
    try:
        async for message in client.generate_many(requests):
            for d in message.deltas:
                got[d.request_id] += len(d.token_ids)  # type: ignore[operator]
                if d.usage.completion_tokens and done is not None:
                    done.append(time.perf_counter())
            for f in message.failures:
                got[f.request_id] = RuntimeError(f"{f.code}: {f.message}")
    except Exception as e:  # the whole stream failed: every generation did
        return [e] * n
    return list(got.values())


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
    kind: str = "unary",
) -> Outcome:
    """The scenario with a `kind` flood (FLOODS); `meanwhile(a's client)`
    runs beside it from the moment the flood is sent (a test's checks of the
    server under the flood). B's call goes `delay` seconds after the flood,
    or once `until()` returns."""
    async with client(target, a) as ca, client(target, b) as cb:
        await probe(cb, probe_tokens)  # warm
        idle = [await probe(cb, probe_tokens) for _ in range(idle_probes)]
        t0 = time.perf_counter()
        done: list[float] = []
        flooding = flood(ca, flood_calls, flood_tokens, done, kind)
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
