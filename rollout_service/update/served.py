"""What the engine serves: the weight version admitted calls are tagged
with (the gate's), and whether it may hold half-loaded weights.

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

from rollout_service.engine.gate import AdmissionGate
from rollout_service.status.errors import FailedPrecondition

log = logging.getLogger(__name__)


class Served:
    """The served version and the degraded state, changed only inside the
    quiesce (quiesce.py) or at wake-up (sleep.py)."""

    def __init__(
        self, gate: AdmissionGate, on_degraded: Callable[[bool], Awaitable[object]] | None = None
    ) -> None:
        self.gate = gate
        # Called with True when the server becomes degraded, False when a
        # full update recovers it (the server ties health to it).
        self._on_degraded = on_degraded
        self.degraded = False

    @property
    def version(self) -> str:
        return self.gate.version

    def check_serving(self) -> None:
        """Refuses generation while degraded."""
        if self.degraded:
            raise FailedPrecondition(
                "the server is degraded: a weight update failed inside the engine; "
                "push a full update (every parameter) to recover"
            )

    async def install(self, version: str) -> None:
        """The engine now serves `version`, whole."""
        self.gate.version = version
        await self._set_degraded(False)

    async def lose(self, why: str) -> None:
        """The engine no longer holds the served weights: degraded, no version."""
        log.warning("degraded: %s", why)
        self.gate.version = ""
        await self._set_degraded(True)

    async def _set_degraded(self, degraded: bool) -> None:
        changed = degraded != self.degraded
        self.degraded = degraded
        if changed and self._on_degraded is not None:
            await self._on_degraded(degraded)
