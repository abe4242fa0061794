"""Running Generate calls by request id, for the Abort RPC.

A call is registered from its first line to its last, so that Abort finds it
wherever it is: waiting at the gate, admitted but not yet in the engine, or
generating. Aborting sets a flag the call checks before it makes its engine
request and ends the engine request if there is one; the engine then returns
the tokens generated so far with FINISH_REASON_ABORT, so the caller gets a
normal response (a stream its last delta), not an error.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager


class Call:
    """One running Generate call."""

    __slots__ = ("request_id", "engine_id", "aborted")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.engine_id: str | None = None
        self.aborted = False


class RunningCalls:
    """The registry Abort reads."""

    def __init__(self) -> None:
        self._by_id: defaultdict[str, set[Call]] = defaultdict(set)

    @contextmanager
    def running(self, request_id: str) -> Iterator[Call]:
        call = Call(request_id)
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
    ) -> list[str]:
        """Aborts the calls with these ids (None: all); returns the ids found."""
        ids = list(self._by_id) if request_ids is None else list(dict.fromkeys(request_ids))
        found = [i for i in ids if i in self._by_id]
        engine_ids = []
        for i in found:
            for call in self._by_id[i]:
                call.aborted = True
                if call.engine_id is not None:
                    engine_ids.append(call.engine_id)
        if engine_ids:
            await abort_engine(engine_ids)
        return found
