"""The admission gate: which weight version a Generate call runs on.

Every Generate call is admitted through the gate and tagged with the version
current at admission. An update (or cache reset) closes the gate, so new calls
wait, and then drains the calls already admitted, by waiting for their engine
requests to finish (WAIT) or by aborting them (ABORT). Only when no admitted
call has an engine request left does it touch the engine; reopening admits
the waiting calls on the new version. So no call ever spans two versions.

A call whose engine request has finished no longer holds an update back,
even while its handler is still writing the last outputs to a client that
reads slowly: those outputs were computed with the old weights and carry the
old version. The wait is bounded: past the deadline, the remaining engine
requests are aborted (they end with FINISH_REASON_ABORT and their partial
tokens), so a stalled client or a very long request can delay an update,
never hang it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from rollout.v1 import rollout_pb2 as pb
from rollout_service.engine.served import Served
from rollout_service.handoff import faults
from rollout_service.status.errors import ResourceExhausted


class Ticket:
    """One admitted call: its version and its engine request, once made."""

    __slots__ = ("version", "engine_id", "started", "adapter_version", "keep_epoch")

    def __init__(self, version: str, keep_epoch: int = 0) -> None:
        self.version = version
        self.keep_epoch = keep_epoch
        # The LoRA adapter's version, for a call that names one.
        self.adapter_version = ""
        # The call's engine request, once made: a drain follows or aborts it.
        self.engine_id: str | None = None
        # True once the engine produced an output for the request: from then
        # on the engine's own bookkeeping tells whether it is still running.
        self.started = False


class AdmissionGate:
    """Admission control for Generate calls: each admitted call's ticket
    carries the served version (served.py) as it was at admission."""

    def __init__(self, served: Served, max_pending: int | None = None) -> None:
        # Whose version and keep epoch each admitted call's ticket carries.
        self.served = served
        # Calls admitted plus waiting; one more gets RESOURCE_EXHAUSTED.
        self.max_pending = max_pending
        self.waiting = 0
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._tickets: set[Ticket] = set()
        # Tests only (handoff/faults.py): None in every server started without
        # the fault file's variable, and then admission never reads a file.
        self._fault_file = faults.fault_file()
        # The version served when the gate last closed: before the update.
        self._before = served.version

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    @property
    def admitted(self) -> int:
        """Calls admitted and not yet finished."""
        return len(self._tickets)

    @asynccontextmanager
    async def admit(self) -> AsyncIterator[Ticket]:
        """Waits until the gate is open, then yields the call's ticket, which
        carries the served version.

        The wait is bounded by the caller's deadline: gRPC cancels the handler.
        """
        if self.max_pending is not None and self.admitted + self.waiting >= self.max_pending:
            raise ResourceExhausted(
                f"{self.admitted + self.waiting} Generate calls are already running or "
                f"waiting, the limit (--max-queued-generate) is {self.max_pending}",
                reason=pb.ERROR_REASON_QUEUE_FULL,
            )
        # Re-check after every wake-up: the gate may close again between the
        # event being set and this task running.
        self.waiting += 1
        try:
            while not self._open.is_set():
                await self._open.wait()
        finally:
            self.waiting -= 1
        ticket = Ticket(self._version(), self.served.keep_epoch)
        self._tickets.add(ticket)
        self._idle.clear()
        try:
            yield ticket
        finally:
            self._tickets.discard(ticket)
            if not self._tickets:
                self._idle.set()

    def engine_requests(self, engine_running: Callable[[str], bool]) -> frozenset[str]:
        """The engine requests of admitted calls that are still running."""
        return frozenset(
            t.engine_id
            for t in self._tickets
            if t.engine_id is not None and engine_running(t.engine_id)
        )

    def _version(self) -> str:
        """The served version, which a new call's ticket carries; under the
        test fault "stale-gate", the one served before the last update."""
        if self._fault_file and faults.read(self._fault_file) == faults.STALE_GATE:
            return self._before
        return self.served.version

    def close(self) -> None:
        """New calls wait (until `open`)."""
        self._before = self.served.version
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    async def drain(
        self,
        engine_running: Callable[[str], bool],
        abort: Callable[[list[str]], Awaitable[None]],
        abort_after: float | None,
        poll_seconds: float = 0.02,
    ) -> int:
        """Waits until no admitted call has an engine request left (call
        with the gate closed: quiesce.py); returns how many engine requests
        it aborted.

        `abort_after` seconds into the wait (0: at once, None: never), the
        engine requests still running are aborted, round after round, so
        that calls registering a request late are caught too.
        """
        loop = asyncio.get_running_loop()
        deadline = None if abort_after is None else loop.time() + abort_after
        aborted: set[str] = set()
        while True:
            pending = [t for t in self._tickets if not self._engine_done(t, engine_running)]
            if not pending:
                return len(aborted)
            if deadline is not None and loop.time() >= deadline:
                ids = sorted(t.engine_id for t in pending if t.engine_id)
                if ids:
                    await abort(ids)
                    aborted.update(ids)
            wait = poll_seconds
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - loop.time())) or poll_seconds
            try:
                await asyncio.wait_for(self._idle.wait(), wait)
            except TimeoutError:
                pass

    @staticmethod
    def _engine_done(ticket: Ticket, engine_running: Callable[[str], bool]) -> bool:
        return (
            ticket.started and ticket.engine_id is not None and not engine_running(ticket.engine_id)
        )
