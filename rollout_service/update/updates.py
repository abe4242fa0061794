"""UpdateWeights and ResetCaches: one update as a chain of values.

    begin ──plan()──> UpdatePlan ──Upload──> ReceivedUpdate ──apply()──> ack
          (plan.py: pure)   (upload.py: bytes in, checked)   (an Applier)

The plan validates begin and lays the update out before a byte arrives;
the receiver takes the bytes (one stream, parallel uploads or a same-host
write: update/transfers.py drives it) and checks them; an Applier takes the
received update into the engine inside the one quiesce (quiesce.py). Two
appliers: the base weights (base_weights.py) and LoRA adapters (lora.py);
begin.adapter picks one, and the plan each value carries says the rest.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from rollout.v1 import rollout_pb2 as pb
from rollout_service.engine.gate import AdmissionGate
from rollout_service.engine.served import Served
from rollout_service.ops import metrics
from rollout_service.status.errors import RpcError
from rollout_service.update.base_weights import BaseWeights
from rollout_service.update.delta_base import DeltaBase
from rollout_service.update.lora import Adapters
from rollout_service.update.plan import UpdatePlan
from rollout_service.update.quiesce import Quiescer
from rollout_service.update.received import ReceivedUpdate
from rollout_service.update.timings import Arrival

# The UpdateTimings fields observed in rollout_update_duration_seconds{phase}.
_PHASES = ("receive", "check", "wait", "drain", "pause", "load", "apply", "reset", "resume")


class Applier(Protocol):
    """What takes one kind of update from begin to acknowledgement."""

    async def region_free(self) -> None:
        """Until the region its updates are written into is free."""

    def plan(self, begin: pb.UpdateWeightsBegin) -> UpdatePlan:
        """Validates begin and lays it out (pure)."""
        ...

    async def apply(self, update: ReceivedUpdate, arrival: Arrival) -> pb.UpdateWeightsResponse:
        """Applies it inside the quiesce; its caller (the commit,
        transfers.py) shields it from cancellation."""
        ...


class WeightUpdater:
    """Picks the applier of each update; ResetCaches; what the server
    reports of the update path."""

    def __init__(self, quiescer: Quiescer, weights: BaseWeights, adapters: Adapters) -> None:
        # Updates, cache resets, adapter switches and sleep, one at a time.
        self.quiescer = quiescer
        self.served: Served = quiescer.served
        self.weights = weights
        self.adapters = adapters

    @property
    def delta_base(self) -> str:
        """GetServerInfo.delta_base_version."""
        return self.weights.base.offered(self.served.version, self.served.degraded)[0]

    def stale_slots(self, names: set[str]) -> None:
        """An update writes into these slots of the served model now: they
        no longer hold the served bytes (DeltaBase.writing; upload.py tells
        it at each slot's first byte)."""
        self.weights.base.writing(names)

    async def start(self) -> None:
        await self.weights.start()

    def close(self) -> None:
        base = self.weights.base
        base.close()
        base.staging.close()
        base.incoming.close()

    def applier(self, begin: pb.UpdateWeightsBegin) -> Applier:
        return self.adapters if begin.HasField("adapter") else self.weights

    async def plan(self, begin: pb.UpdateWeightsBegin) -> UpdatePlan:
        """The first value of the chain, once the region is free for it."""
        applier = self.applier(begin)
        # The last base update's content may still be being read from the
        # staging region (base_weights.region_free).
        await self.weights.region_free()
        await applier.region_free()
        return applier.plan(begin)

    async def apply(self, update: ReceivedUpdate, arrival: Arrival) -> pb.UpdateWeightsResponse:
        """The last: applies a received update; counted in the metrics."""
        try:
            self.quiescer.check_awake()
            ack = await self.applier(update.begin).apply(update, arrival)
        except RpcError as e:
            metrics.UPDATES.labels(e.code.name).inc()
            raise
        except asyncio.CancelledError:
            metrics.UPDATES.labels("CANCELLED").inc()
            raise
        metrics.UPDATES.labels("OK").inc()
        metrics.UPDATE_BYTES.inc(ack.bytes_received)
        for phase in _PHASES:
            metrics.UPDATE_SECONDS.labels(phase).observe(getattr(ack.timings, f"{phase}_seconds"))
        metrics.WEIGHT_VERSION.info({"version": ack.weight_version})
        return ack

    async def reset_caches(self) -> pb.ResetCachesResponse:
        """ResetCaches: the quiesce with no work in it, only its reset."""
        self.quiescer.check_awake()
        return await asyncio.shield(self._reset_caches())

    async def _reset_caches(self) -> pb.ResetCachesResponse:
        async with self.quiescer.quiesced() as quiesced:
            await self.quiescer.reset(quiesced)
        return pb.ResetCachesResponse(
            results=quiesced.results, duration_seconds=time.perf_counter() - quiesced.t0
        )


def build_updater(
    engine,
    gate: AdmissionGate,
    manifest: dict[str, pb.TensorSpec],
    max_update_bytes: int,
    base: DeltaBase,
    *,
    groups: dict[str, list[str]] | None = None,
    kv_connector: bool = False,
    drain_timeout_seconds: float = 120.0,
    broadcast: bool = False,
    keep_refusal: str | None = None,
) -> WeightUpdater:
    """The update path for one engine: the quiesce, both appliers, the updater."""
    quiescer = Quiescer(engine, gate, kv_connector, drain_timeout_seconds)
    weights = BaseWeights(
        engine,
        quiescer,
        manifest,
        max_update_bytes,
        base,
        groups=groups,
        broadcast=broadcast,
        keep_refusal=keep_refusal,
    )
    adapters = Adapters(engine, manifest, quiescer, base.incoming, max_update_bytes)
    return WeightUpdater(quiescer, weights, adapters)
