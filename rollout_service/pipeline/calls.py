"""Running Generate calls by request id, for the Abort RPC.

A call is registered from its first line to its last, so that Abort finds it
wherever it is: waiting at the gate, admitted but not yet in the engine, or
generating. Aborting sets a flag the call checks before it makes its engine
request and ends the engine request if there is one; the engine then returns
the tokens generated so far with FINISH_REASON_ABORT, so the caller gets a
normal response (a stream its last delta), not an error.

Each call remembers its caller (auth.CALLER when it started): an Abort from a
caller without the admin role finds only that caller's own calls, so one
rollout worker cannot end another's (or learn their request ids).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager

from rollout_service.ops.auth import CALLER, Caller


class Call:
    """One running Generate call."""

    __slots__ = ("request_id", "engine_id", "_aborted", "owner")

    def __init__(self, request_id: str, owner: str) -> None:
        self.request_id = request_id
        self.engine_id: str | None = None
        # Set by Abort: also wakes a call waiting for an engine seat (fairness/).
        self._aborted = asyncio.Event()
        self.owner = owner

    @property
    def aborted(self) -> bool:
        return self._aborted.is_set()

    @aborted.setter
    def aborted(self, value: bool) -> None:
        if value:
            self._aborted.set()
        else:
            self._aborted.clear()

    @property
    def abort_event(self) -> asyncio.Event:
        return self._aborted


class RunningCalls:
    """The registry Abort reads."""

    def __init__(self) -> None:
        self._by_id: defaultdict[str, set[Call]] = defaultdict(set)

    @contextmanager
    def running(self, request_id: str) -> Iterator[Call]:
        call = Call(request_id, CALLER.get().owner)
        self._by_id[request_id].add(call)
        try:
            yield call
        finally:
            calls = self._by_id[request_id]
            calls.discard(call)
            if not calls:
                del self._by_id[request_id]

    async def abort(
        self,
        request_ids: Iterable[str] | None,
        abort_engine: Callable[[list[str]], Awaitable[None]],
        caller: Caller,
    ) -> list[str]:
        """Aborts the calls with these ids (None: all) that `caller` may end
        (an admin: any; others: their own); returns the ids found."""
        ids = list(self._by_id) if request_ids is None else list(dict.fromkeys(request_ids))
        found, engine_ids = [], []
        for i in ids:
            calls = [c for c in self._by_id.get(i, ()) if caller.admin or c.owner == caller.owner]
            if calls:
                found.append(i)
            for call in calls:
                call.aborted = True
                if call.engine_id is not None:
                    engine_ids.append(call.engine_id)
        if engine_ids:
            await abort_engine(engine_ids)
        return found
