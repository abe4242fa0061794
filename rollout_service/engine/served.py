"""What the engine serves: the weight version admitted calls are tagged
with, the keep epoch, and whether it may hold half-loaded weights. The one
owner of these facts: the gate (gate.py) reads them when it admits a call,
the quiesce (update/quiesce.py) and the sleep (update/sleep.py) change them.

A load that fails inside the engine leaves layers that were already written
with the new weights and the others with the old ones: the server is then
degraded (no version claimed, Generate refused, health NOT_SERVING) until a
full update succeeds. Putting the old weights back would need a copy of them
that the engine does not keep (see param_groups.py). A level-2 Sleep drops
the weights: the server wakes up degraded the same way (sleep.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from rollout_service.status.errors import FailedPrecondition

log = logging.getLogger(__name__)


class Served:
    """The served version, the keep epoch and the degraded state, changed
    only inside the quiesce (update/quiesce.py) or at wake-up (update/sleep.py)."""

    def __init__(
        self, version: str, on_degraded: Callable[[bool], Awaitable[object]] | None = None
    ) -> None:
        self.version = version
        # Counts PAUSE_MODE_KEEP updates: a call admitted in the same epoch as
        # now has not been switched to other weights mid-way (its tokens all
        # carry its admission version, no span lookup needed).
        self.keep_epoch = 0
        # Called with True when the server becomes degraded, False when a
        # full update recovers it (the server ties health to it).
        self._on_degraded = on_degraded
        self.degraded = False

    def check_serving(self) -> None:
        """Refuses generation while degraded."""
        if self.degraded:
            raise FailedPrecondition(
                "the server is degraded: a weight update failed inside the engine; "
                "push a full update (every parameter) to recover"
            )

    def keep_across(self) -> None:
        """A PAUSE_MODE_KEEP update is loading (the engine paused): the calls
        it keeps have tokens of two versions from now on."""
        self.keep_epoch += 1

    async def install(self, version: str) -> None:
        """The engine now serves `version`, whole."""
        self.version = version
        await self._set_degraded(False)

    async def lose(self, why: str) -> None:
        """The engine no longer holds the served weights: degraded, no version."""
        log.warning("degraded: %s", why)
        self.version = ""
        await self._set_degraded(True)

    async def _set_degraded(self, degraded: bool) -> None:
        changed = degraded != self.degraded
        self.degraded = degraded
        if changed and self._on_degraded is not None:
            await self._on_degraded(degraded)
