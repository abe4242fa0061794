"""The applier of base weight updates: a ReceivedUpdate into the engine.

Inside the one quiesce (quiesce.py: gate closed, calls drained, or kept with
PAUSE_MODE_KEEP, engine paused), load the staged tensors through vLLM's
weight-transfer API, reset every cache, resume, install the version, reopen.
Only then is the update acknowledged. The sequence runs to its end even if
the call is cancelled (the one shield is at the commit, transfers.py), so the
engine is never left paused or half-updated by a client that went away.

Deltas (UpdateWeightsBegin.base_version) are decoded into the staging
region's slots inside the quiesce, a group of tensors at a time while the
engine loads the group before (delta_load.py), and undone if anything
fails (delta_base.py): a failed delta leaves the base as it was.

Retries: an update that was applied after its client went away is
recognised when the client retries the same version with the same tensors
and bytes, and answered with the original acknowledgement instead of
"already the served version". A retry that arrives while the original is
still applying waits for it first (update/transfers.py), then is recognised
the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rollout.v1 import rollout_pb2 as pb
from rollout_service.handoff.region import StagingRegion
from rollout_service.handoff.staged_tensor import BACKEND_NAME, StagedTensor
from rollout_service.status.errors import FailedPrecondition
from rollout_service.update.delta_base import DeltaBase
from rollout_service.update.delta_load import decode_while_loading
from rollout_service.update.plan import Placement, Target, UpdatePlan, plan_update
from rollout_service.update.quiesce import Quiescer
from rollout_service.update.received import ReceivedUpdate
from rollout_service.update.timings import (
    Arrival,
    ack_timings,
    keep_held,
    phases,
    report_held,
)
from rollout_service.update.version_names import VersionNames, slots_digest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Applied:
    """The update that installed the served version, for retries."""

    ack: pb.UpdateWeightsResponse
    # Its content (ReceivedUpdate.content), computed beside the apply.
    content: asyncio.Future


class BaseWeights:
    """Plans and applies updates of the served model's parameters."""

    def __init__(
        self,
        engine,
        quiescer: Quiescer,
        manifest: dict[str, pb.TensorSpec],
        max_update_bytes: int,
        base: DeltaBase,
        *,
        groups: Mapping[str, Sequence[str]] | None = None,
        broadcast: bool = False,
        keep_refusal: str | None = None,
    ) -> None:
        self.engine = engine
        self.quiescer = quiescer
        self.served = quiescer.served
        self.manifest = manifest
        self.max_update_bytes = max_update_bytes
        # The staging region laid out as the model, and the incoming region
        # where deltas and possible retries arrive (delta_base.py).
        self.base = base
        # name -> every name of its fused group (param_groups.py)
        self.groups = {n: list(names) for names in (groups or {}).values() for n in names}
        # Workers other than the first get the tensors over the engine's
        # process group instead of from the region (weights_backend.py).
        self.broadcast = broadcast
        # Why PAUSE_MODE_KEEP is refused on this server (None: accepted).
        self.keep_refusal = keep_refusal
        self._last: _Applied | None = None
        # What each version served so far named (version_names.py).
        self.names = VersionNames()

    @property
    def staging(self) -> StagingRegion:
        return self.base.staging

    async def start(self) -> None:
        """Initialises the weight-transfer backend in the workers."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        await self.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info={}))
        log.info("weight transfer backend %s ready", BACKEND_NAME)

    async def region_free(self) -> None:
        """Until the last update's content is no longer being read from the
        region (it is computed beside the apply, off its critical path)."""
        last = self._last
        if last is not None and not last.content.done():
            await asyncio.shield(last.content)

    def name_start(self, version: str) -> None:
        """The starting version names the checkpoint's weights: their digest
        from the delta base's slots when it holds them (in a thread, at
        start), else nothing (the name is then never pushed again)."""
        held = self.base.enabled and self.base.version == version
        named = (
            slots_digest(self.staging.ensure(0), self.base.offsets, self.manifest) if held else None
        )
        self.names.served(version, named)

    def plan(self, begin: pb.UpdateWeightsBegin) -> UpdatePlan:
        """Validates `begin` against the served model. A full update's
        slots count as no longer holding the served bytes once its first
        byte is written into them (upload.py, through
        WeightUpdater.stale_slots), not from here: one aborted before that
        leaves the delta base offered."""
        offered, why = self.base.offered(self.served.version, self.served.degraded)
        last = self._last
        plan = plan_update(
            begin,
            Target(
                manifest=self.manifest,
                current_version=self.served.version,
                groups=self.groups,
                replayable_version=last.ack.weight_version if last is not None else None,
                keep_refusal=self.keep_refusal,
            ),
            Placement(
                staging=self.staging,
                slots=self.base.offsets if self.base.enabled else None,
                incoming=self.base.incoming,
                delta_base=offered,
                no_base_why=why,
            ),
            self.max_update_bytes,
        )
        if begin.weight_version != self.served.version:
            self.names.check_begin(begin, full=self._full(begin))
        return plan

    async def apply(self, update: ReceivedUpdate, arrival: Arrival) -> pb.UpdateWeightsResponse:
        """Applies `update`, or recognises a retry of the one that installed
        the served version."""
        if update.weight_version == self.served.version:
            return await self._replay(update)
        if self.served.degraded and update.names != set(self.manifest):
            raise FailedPrecondition(
                "the server is degraded: only a full update (every parameter) can recover "
                f"it, this one has {len(update.names)} of {len(self.manifest)}"
            )
        if update.weight_version in self.names:
            content = await asyncio.to_thread(update.content)
            self.names.check_bytes(update.weight_version, content)
        return await self._decode_and_load(update, arrival)

    def _full(self, begin: pb.UpdateWeightsBegin) -> bool:
        """Every parameter, whole (not a delta)."""
        return not begin.base_version and len(begin.tensors) == len(self.manifest)

    async def _replay(self, update: ReceivedUpdate) -> pb.UpdateWeightsResponse:
        """A stream naming the served version: the original acknowledgement
        if it is a retry of the update that installed it, else refused."""
        last = self._last
        content = await asyncio.to_thread(update.content)
        if last is None or await last.content != content:
            raise FailedPrecondition(
                f"begin.weight_version: {update.weight_version!r} is already the served "
                "version, and this stream's tensors differ from the update that installed it",
                reason=pb.ERROR_REASON_VERSION_ALREADY_SERVED,
            )
        log.info("UpdateWeights %r: a retry of the applied update", update.weight_version)
        ack = pb.UpdateWeightsResponse()
        ack.CopyFrom(last.ack)
        ack.replayed = True
        return ack

    async def _decode_and_load(
        self, update: ReceivedUpdate, arrival: Arrival
    ) -> pb.UpdateWeightsResponse:
        # The region is this update's until it ends (one at a time,
        # update/transfers.py).
        self._last = None
        if update.delta is not None:
            # Entries that do not decode: refused before the engine is touched.
            await asyncio.to_thread(self.base.check, update.delta)
        try:
            return await self._load(update, arrival)
        except BaseException:
            if update.delta is not None:
                await asyncio.to_thread(self.base.undo, update.delta)
            raise

    async def _send(self, tensors: list[StagedTensor]) -> None:
        """Has the engine load `tensors` from the staging region (inside a
        weight update: start_weight_update, then one call or several)."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        await self.engine.update_weights(
            WeightTransferUpdateRequest(
                update_info={
                    "shm_name": self.staging.name,
                    "tensors": [t.as_wire() for t in tensors],
                    "broadcast": self.broadcast,
                }
            )
        )

    async def _load(self, update: ReceivedUpdate, arrival: Arrival) -> pb.UpdateWeightsResponse:
        version = update.weight_version
        # Read beside the apply (crc32c releases the GIL); awaited before the
        # region is written again (region_free).
        content = asyncio.ensure_future(asyncio.to_thread(update.content))
        decode_s = 0.0
        # Gate closed, admitted calls drained (WAIT, ABORT) or kept (KEEP),
        # the engine paused:
        async with self.quiescer.quiesced(
            update.pause_mode, update.drain_timeout_seconds, installs=version
        ) as quiesced:
            previous = self.served.version
            t_load = time.perf_counter()
            if update.delta is None:
                await self.engine.start_weight_update()
                await self._send(update.tensors)
            else:
                # Refused (INVALID_ARGUMENT) with the base put back and the
                # engine on the served weights if a tensor does not decode to
                # its declared CRC-32C.
                decode_s = await decode_while_loading(
                    self.base, update.delta, update.tensors, self.engine, self._send
                )
            if update.pause_mode == pb.PAUSE_MODE_KEEP:
                # Kept calls' tokens now span two versions.
                self.served.keep_across()
            await self.engine.finish_weight_update(weight_version=version)
            # Every cache computed with the old weights: prefix/KV (kept
            # requests preempted, their KV recomputed), multimodal, encoder.
            await self.quiescer.reset(quiesced)
        # The engine resumed, `version` installed, the gate reopened: only
        # now is the update acknowledged.
        t_end = time.perf_counter()
        self.base.installed(version, update.names if not update.base_version else set())
        self.names.served_as(version, content if self._full(update.begin) else None)
        timings = ack_timings(arrival, quiesced, t_end, quiesced.t_reset - t_load, decode_s)
        log.info(
            "weights %r -> %r: %d tensors, %d bytes, %s",
            previous,
            version,
            len(update.tensors),
            update.bytes_received,
            phases(timings),
        )
        ack = pb.UpdateWeightsResponse(
            weight_version=version,
            previous_weight_version=previous,
            bytes_received=update.bytes_received,
            tensors_loaded=len(update.tensors),
            caches_reset=quiesced.results,
            timings=timings,
            requests_aborted=quiesced.aborted,
        )
        if update.pause_mode == pb.PAUSE_MODE_KEEP:
            ack.requests_kept = len(quiesced.running)
            if (held := keep_held(arrival, quiesced)) is not None:
                ack.keep_held.CopyFrom(held)
                report_held(version, held)
        self._last = _Applied(ack=ack, content=content)
        return ack
