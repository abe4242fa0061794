"""Sleep and WakeUp: freeing the accelerator for a trainer that shares it.

vLLM's sleep mode offloads the weights (level 1) or drops them (level 2) and
frees the KV cache. Only GPU platforms have it (vLLM's
`Platform.is_sleep_mode_available`), and only an engine started with
--enable-sleep-mode; everywhere else Sleep is FAILED_PRECONDITION saying which.

While asleep the gate stays closed: Generate calls wait there (bounded by
their deadlines) and run after WakeUp; updates and cache resets are refused.
After level 2 the weights are gone, so the server wakes up degraded: no
version is claimed and only a full update is accepted.
"""

from __future__ import annotations

import logging

from rollout.v1 import rollout_pb2 as pb
from rollout_service.engine.served import Served
from rollout_service.status import static_rules
from rollout_service.status.errors import FailedPrecondition
from rollout_service.update.quiesce import Quiescer

log = logging.getLogger(__name__)


def sleep_unavailable_reason(engine) -> str | None:
    """Why this engine cannot sleep, or None when it can."""
    from vllm.platforms import current_platform

    if not current_platform.is_sleep_mode_available():
        return (
            f"vLLM's sleep mode is not available on this platform ({current_platform.device_name}"
            "); it needs a CUDA, ROCm or XPU GPU"
        )
    if not engine.model_config.enable_sleep_mode:
        return "the engine was started without --enable-sleep-mode"
    return None


class Sleeper:
    """Sleep and WakeUp: a quiesce that the engine stays in until WakeUp
    (quiesce.py; the Quiescer holds the asleep state, and the updater
    refuses updates and resets while it is set)."""

    def __init__(self, engine, quiescer: Quiescer, served: Served) -> None:
        """`quiescer`: the one quiesce (the updater's); `served`: what the
        engine serves, lost when a level-2 Sleep drops the weights."""
        self.engine = engine
        self.quiescer = quiescer
        self.served = served
        self.refusal = sleep_unavailable_reason(engine)
        self._level = 0

    @property
    def sleeping(self) -> bool:
        return self.quiescer.asleep

    @property
    def available(self) -> bool:
        return self.refusal is None

    async def sleep(self, level: int) -> pb.SleepResponse:
        if self.refusal is not None:
            raise FailedPrecondition(
                f"Sleep: {self.refusal}", reason=pb.ERROR_REASON_SLEEP_UNAVAILABLE
            )
        # After the platform's refusal, as before the rule moved to the
        # contract: where sleep is unavailable, any level says so.
        static_rules.check(pb.SleepRequest(level=level))
        self.quiescer.check_awake()
        async with self.quiescer.quiesced(pb.PAUSE_MODE_WAIT, sleep=True):
            await self.engine.sleep(level)
            self._level = level
        log.info("the engine sleeps (level %d); Generate waits until WakeUp", level)
        return pb.SleepResponse()

    async def wake_up(self) -> pb.WakeUpResponse:
        if not self.sleeping:
            raise FailedPrecondition(
                "the engine is not asleep", reason=pb.ERROR_REASON_SLEEP_UNAVAILABLE
            )
        async with self.quiescer.woken():
            await self.engine.wake_up()
            needs_weights = self._level >= 2
            if needs_weights:
                await self.served.lose("the weights were dropped by a level-2 Sleep")
            self._level = 0
        log.info("the engine is awake%s", "; push a full update" if needs_weights else "")
        return pb.WakeUpResponse(needs_weights=needs_weights)
