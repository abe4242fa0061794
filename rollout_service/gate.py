"""The admission gate: which weight version a Generate call runs on.

Every Generate call is admitted through the gate and tagged with the version
current at admission. An update (or cache reset) closes the gate, so new calls
wait, and then drains the calls already admitted, by waiting for them (WAIT)
or by aborting their engine requests (ABORT). Only when no admitted call is
left does it touch the engine; reopening admits the waiting calls on the new
version. So no call ever spans two versions.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

from rollout_service.errors import ResourceExhausted


class AdmissionGate:
    """Admission control for Generate calls, and the served weight version."""

    def __init__(self, version: str, max_pending: int | None = None) -> None:
        self.version = version
        # Calls admitted plus waiting; one more gets RESOURCE_EXHAUSTED.
        self.max_pending = max_pending
        self.waiting = 0
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._admitted = 0
        self._engine_ids: set[str] = set()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    @property
    def admitted(self) -> int:
        """Calls admitted and not yet finished."""
        return self._admitted

    @asynccontextmanager
    async def admit(self) -> AsyncIterator[str]:
        """Waits until the gate is open, then yields the served version.

        The wait is bounded by the caller's deadline: gRPC cancels the handler.
        """
        if self.max_pending is not None and self._admitted + self.waiting >= self.max_pending:
            raise ResourceExhausted(
                f"{self._admitted + self.waiting} Generate calls are already running or "
                f"waiting, the limit (--max-queued-generate) is {self.max_pending}"
            )
        # Re-check after every wake-up: the gate may close again between the
        # event being set and this task running.
        self.waiting += 1
        try:
            while not self._open.is_set():
                await self._open.wait()
        finally:
            self.waiting -= 1
        self._admitted += 1
        self._idle.clear()
        try:
            yield self.version
        finally:
            self._admitted -= 1
            if self._admitted == 0:
                self._idle.set()

    @contextmanager
    def track(self, engine_request_id: str) -> Iterator[None]:
        """Registers an engine request of an admitted call, so that an ABORT
        drain can find it."""
        self._engine_ids.add(engine_request_id)
        try:
            yield
        finally:
            self._engine_ids.discard(engine_request_id)

    @asynccontextmanager
    async def closed(self) -> AsyncIterator[None]:
        """Closes admission for the duration of the block."""
        self._open.clear()
        try:
            yield
        finally:
            self._open.set()

    async def drain(
        self,
        abort: Callable[[list[str]], Awaitable[None]] | None = None,
        poll_seconds: float = 0.02,
    ) -> None:
        """Waits until no admitted call is left (call inside `closed()`).

        With `abort`, it is called on the engine requests of admitted calls
        until they are all gone; calls that register a request after a round
        are caught by the next one.
        """
        if abort is None:
            await self._idle.wait()
            return
        while not self._idle.is_set():
            if self._engine_ids:
                await abort(sorted(self._engine_ids))
            try:
                await asyncio.wait_for(self._idle.wait(), poll_seconds)
            except TimeoutError:
                pass
