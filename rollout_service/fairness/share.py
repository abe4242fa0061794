"""The per-caller ledger: requests in flight, shares, priorities, the cap.

A request's engine priority is `in_flight // share`: the number of the
caller's requests already in flight when it arrived, divided by its share
(vLLM runs lower values first, equal values in arrival order). A caller
flooding the engine gives its requests priorities 0, 1, 2, ...; another
caller's single request gets 0 and goes ahead of all but the flood's first.
With shares 2 and 1, the first caller's requests go two for one.

What it costs: vLLM's priority queue is a heap (O(log n) per request, where
FCFS is a deque), and under KV-cache pressure vLLM preempts the running
request with the highest priority value, not the last one scheduled
(benchmarks/fair_share.py measures the throughput against FCFS).

Priorities order only the engine's waiting queue: a request that waits
there still waits for a running one to finish, and a flood fills every one
of the engine's sequence slots (vLLM's max_num_seqs) with requests that all
end together. So a caller may also hold at most `seats` engine requests at
once (default: max_num_seqs less an eighth); its others wait here, in
arrival order, before the gate. Another caller's request then finds a free
slot and joins the running batch at the engine's next step.

The front shares itself the same way: one engine step wakes every running
stream at once, and a request that came past its caller's share lets the
others' outputs of that step go first (`gives_way`), so another caller's
first token is not sent behind a flood's deltas.

Calls past `max_per_caller` in flight get RESOURCE_EXHAUSTED
(CALLER_QUEUE_FULL) with a retry hint, before any work is done for them.
Everything here runs on the event loop, in O(1) per call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

from rollout.v1 import rollout_pb2 as pb
from rollout_service.fairness.identity import CallerId
from rollout_service.ops import metrics
from rollout_service.status.errors import ResourceExhausted

# The retry hint past the cap: about the time one of the caller's requests
# takes to finish on a busy engine (seconds of a 256-token rollout here).
RETRY_AFTER_SECONDS = 1.0
# GetServerInfo lists the callers with the most requests in flight, at most this many.
MAX_LISTED = 64


def parse_shares(spec: str) -> dict[str, int]:
    """`--caller-shares`: comma-separated KEY=N, KEY one of `admin`,
    `generate` (roles, with auth on) or `tenant:NAME` (the rollout-tenant
    metadata), N a whole number from 1 to 1000. Unnamed callers have 1."""
    shares: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        key, sep, value = item.rpartition("=")
        key = key.strip()
        if not sep or not (key in ("admin", "generate") or key.startswith("tenant:")):
            raise ValueError(
                f"--caller-shares: {item!r}: expected KEY=N with KEY admin, generate or tenant:NAME"
            )
        if not value.strip().isdigit() or not 1 <= int(value) <= 1000:
            raise ValueError(f"--caller-shares: {item!r}: N must be a whole number from 1 to 1000")
        shares[key] = int(value)
    return shares


@dataclass
class CallerLoad:
    """One caller's requests in flight now (`in_engine` of them holding an
    engine seat, the rest waiting for one), and its engine seats."""

    label: str
    share: int
    seats: asyncio.Semaphore | None
    in_flight: int = 0
    in_engine: int = 0

    def __post_init__(self) -> None:
        # Its metrics' children, looked up once (labels() costs a lock and a
        # dict per call; these move on every request).
        self.in_flight_gauge = metrics.CALLER_IN_FLIGHT.labels(self.label)
        self.in_engine_gauge = metrics.CALLER_IN_ENGINE.labels(self.label)
        self.prompt_tokens = metrics.CALLER_TOKENS.labels(self.label, "prompt")
        self.completion_tokens = metrics.CALLER_TOKENS.labels(self.label, "completion")


@dataclass
class Slot:
    """One request's place: its engine priority, and where to count its tokens."""

    priority: int
    load: CallerLoad

    @asynccontextmanager
    async def seat(self, abandon: asyncio.Event) -> AsyncIterator[bool]:
        """One of the caller's engine seats, held while its request is in
        the engine (taken before the gate: a call waiting here holds no
        admission, so an update does not wait for it). Yields False, with no
        seat, when `abandon` is set first (the call was aborted: it ends at
        once, as one queued in the engine would)."""
        load = self.load
        if load.seats is not None and not await _acquire_unless(load.seats, abandon):
            yield False
            return
        load.in_engine += 1
        load.in_engine_gauge.inc()
        try:
            yield True
        finally:
            load.in_engine -= 1
            load.in_engine_gauge.dec()
            if load.seats is not None:
                load.seats.release()

    def count(self, prompt_tokens: int, completion_tokens: int) -> None:
        """The tokens one of its engine requests processed (metrics)."""
        self.load.prompt_tokens.inc(prompt_tokens)
        self.load.completion_tokens.inc(completion_tokens)


async def _acquire_unless(seats: asyncio.Semaphore, abandon: asyncio.Event) -> bool:
    """Takes a seat (True), unless `abandon` is set first (False, none taken)."""
    if abandon.is_set():
        return False
    if not seats.locked():
        await seats.acquire()  # free: no wait
        return True
    acquire = asyncio.ensure_future(seats.acquire())
    abandoned = asyncio.ensure_future(abandon.wait())
    got = False
    try:
        await asyncio.wait({acquire, abandoned}, return_when=asyncio.FIRST_COMPLETED)
        got = acquire.done() and not acquire.cancelled() and not abandon.is_set()
        return got
    finally:
        abandoned.cancel()
        if not got:
            # Taken as the call was abandoned or cancelled: given back.
            if acquire.done() and not acquire.cancelled():
                seats.release()
            else:
                acquire.cancel()


class FairShare:
    """Callers with requests in flight (a caller is forgotten when it has
    none: the ledger holds at most one entry per request in flight)."""

    def __init__(
        self,
        enabled: bool,
        shares: dict[str, int],
        max_per_caller: int | None,
        seats: int | None = None,
    ) -> None:
        self.enabled = enabled
        self.shares = shares
        self.max_per_caller = max_per_caller
        self.seats = seats if enabled else None
        self.callers: dict[str, CallerLoad] = {}

    @staticmethod
    def default_seats(max_num_seqs: int) -> int:
        """A caller's engine seats: the engine's sequence slots less an
        eighth, which stay free for other callers."""
        return max(1, max_num_seqs - max(1, max_num_seqs // 8))

    @contextmanager
    def slot(self, who: CallerId) -> Iterator[Slot]:
        """Counts one request of `who` while it runs; refuses it past the cap."""
        load = self.callers.get(who.key)
        if load is None:
            seats = asyncio.Semaphore(self.seats) if self.seats else None
            share = self.shares.get(who.share_key, 1)
            load = self.callers[who.key] = CallerLoad(who.label, share, seats)
        if self.max_per_caller is not None and load.in_flight >= self.max_per_caller:
            if not load.in_flight:
                del self.callers[who.key]
            raise ResourceExhausted(
                f"this caller ({who.label}) has {load.in_flight} requests in flight, the limit "
                f"(--max-requests-per-caller) is {self.max_per_caller}; retry after one ends",
                reason=pb.ERROR_REASON_CALLER_QUEUE_FULL,
                retry_after=RETRY_AFTER_SECONDS,
            )
        priority = load.in_flight // load.share if self.enabled else 0
        load.in_flight += 1
        load.in_flight_gauge.inc()
        try:
            yield Slot(priority, load)
        finally:
            load.in_flight -= 1
            load.in_flight_gauge.dec()
            if not load.in_flight:
                del self.callers[who.key]

    def gives_way(self, slot: Slot) -> bool:
        """Whether `slot`'s outputs let other callers' go first (Generations.run):
        fair share on, the request came past its caller's share (priority
        over 0) and another caller has requests in flight. One caller alone
        never waits on itself."""
        return slot.priority > 0 and len(self.callers) > 1

    def to_proto(self) -> pb.FairShareInfo:
        return pb.FairShareInfo(
            enabled=self.enabled,
            shares=self.shares,
            max_requests_per_caller=self.max_per_caller or 0,
            engine_seats_per_caller=self.seats or 0,
            callers=[
                pb.CallerLoad(
                    caller=c.label, share=c.share, in_flight=c.in_flight, in_engine=c.in_engine
                )
                for c in sorted(self.callers.values(), key=lambda c: -c.in_flight)[:MAX_LISTED]
            ],
        )
