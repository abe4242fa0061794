"""UpdateWeights and ResetCaches: the atomic apply-and-reset sequence.

Receive: the stream is assembled and validated in the staging region while
generation goes on. Apply, as one step that a cancelled call cannot cut in
half: the quiesce (quiesce.py: close admission, drain or abort the admitted
calls, or keep them with PAUSE_MODE_KEEP, pause the engine), load the staged
tensors through vLLM's weight-transfer API, reset every cache, resume,
reopen admission on the new version. Only then is the update acknowledged.

A failure inside the engine while loading leaves layers that were already
written with the new weights and the others with the old ones: the server
is then degraded (no version claimed, Generate refused, health NOT_SERVING)
until a full update succeeds. Putting the old weights back would need a
copy of them that the engine does not keep (see param_groups.py).

Retries: an update that was applied after its client went away (the apply
is shielded from cancellation) is recognised when the client retries the
same version with the same tensors and bytes, and answered with the
original acknowledgement instead of "already the served version". A retry
that arrives while the original is still applying waits for it first
(update/sessions.py), then is recognised the same way.

Deltas (UpdateWeightsBegin.base_version) are decoded into the staging
region's slots just before the quiesce, and undone if anything after fails
(delta_base.py): a failed delta leaves the base as it was.

Receiving (one UpdateWeights stream, or a staged update's uploads) is
update/sessions.py's; this module takes a complete update from there.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass

from rollout.v1 import rollout_pb2 as pb
from rollout_service.errors import FailedPrecondition, RpcError
from rollout_service.gate import AdmissionGate
from rollout_service.handoff.region import StagingRegion
from rollout_service.handoff.staged_tensor import BACKEND_NAME
from rollout_service.ops import metrics
from rollout_service.update.assembler import Placement, StagedUpdate, UpdateAssembler
from rollout_service.update.delta_base import DeltaBase
from rollout_service.update.lora import Adapters
from rollout_service.update.quiesce import Quiescer

log = logging.getLogger(__name__)


class EngineFailure(RpcError):
    """The engine failed while loading: INTERNAL, and the server is degraded."""

    reason = pb.ERROR_REASON_ENGINE_FAILURE


@dataclass
class _Applied:
    """The update that installed the served version, for retries."""

    ack: pb.UpdateWeightsResponse
    # Its content (StagedUpdate.content), computed beside the apply.
    content: asyncio.Future


class WeightUpdater:
    """Owns the staging region, the degraded state and what an update does
    inside the quiesce."""

    def __init__(
        self,
        engine,
        gate: AdmissionGate,
        manifest: dict[str, pb.TensorSpec],
        max_update_bytes: int,
        on_degraded=None,
        groups: dict[str, list[str]] | None = None,
        kv_connector: bool = False,
        drain_timeout_seconds: float = 120.0,
        staging: StagingRegion | None = None,
        broadcast: bool = False,
        keep_refusal: str | None = None,
        adapters: Adapters | None = None,
        incoming: StagingRegion | None = None,
        decode_threads: int = 1,
        decode_cpus: set[int] | None = None,
    ) -> None:
        self.engine = engine
        # Called with True when an update fails inside the engine, False when
        # a full update recovers (the server ties health to it).
        self._on_degraded = on_degraded
        self.gate = gate
        self.manifest = manifest
        self.max_update_bytes = max_update_bytes
        # name -> every name of its fused group (param_groups.py)
        self._groups = {n: names for names in (groups or {}).values() for n in names}
        # Updates, cache resets, adapter switches and sleep, one at a time.
        self.quiet = Quiescer(engine, gate, kv_connector, drain_timeout_seconds)
        # Workers other than the first get the tensors over the engine's
        # process group instead of from the region (weights_backend.py).
        self._broadcast = broadcast
        # Reserved by the server before the engine started (reservation.py).
        self.staging = staging or StagingRegion()
        # Deltas, adapters and possible retries arrive here instead, so
        # that they never write the served bytes in the slots.
        self.incoming = incoming or StagingRegion()
        self.base = DeltaBase(manifest, self.staging, self.incoming, decode_threads, decode_cpus)
        # Set when an engine failure may have left weights half-loaded.
        self.degraded = False
        # Why PAUSE_MODE_KEEP is refused on this server (None: accepted).
        self.keep_refusal = keep_refusal
        self._last: _Applied | None = None
        # LoRA adapters (lora.py; None only in unit tests of base updates),
        # and the plan of each open adapter update, by adapter name.
        self.adapters = adapters
        self._plans: dict = {}

    @property
    def drain_timeout_seconds(self) -> float:
        return self.quiet.drain_timeout_seconds

    async def lose_weights(self, why: str) -> None:
        """The engine no longer holds the served weights: degraded, no version."""
        log.warning("degraded: %s", why)
        self.gate.version = ""
        await self._set_degraded(True)

    async def start(self) -> None:
        """Initialises the weight-transfer backend in the workers."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        await self.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info={}))
        log.info("weight transfer backend %s ready", BACKEND_NAME)

    def close(self) -> None:
        self.base.close()
        self.staging.close()
        self.incoming.close()

    @property
    def delta_base(self) -> str:
        """GetServerInfo.delta_base_version."""
        return self.base.offered(self.gate.version, self.degraded)[0]

    def check_serving(self) -> None:
        """Refuses generation while degraded."""
        if self.degraded:
            raise FailedPrecondition(
                "the server is degraded: a weight update failed inside the engine; "
                "push a full update (every parameter) to recover"
            )

    async def assembler(self, begin: pb.UpdateWeightsBegin | None = None) -> UpdateAssembler:
        """A new assembler writing into the staging region, once the region
        is free: the last update's content may still be being read from it.
        For a LoRA adapter's `begin`, one that checks the adapter's tensors."""
        last = self._last
        if last is not None and not last.content.done():
            await asyncio.shield(last.content)
        if begin is not None and begin.HasField("adapter"):
            assert self.adapters is not None, "app.build_app gives every server its Adapters"
            plan = self.adapters.plan(begin)
            self._plans[begin.adapter.name] = plan
            return UpdateAssembler(
                plan.manifest,
                self.max_update_bytes,
                self.incoming,
                plan.current_version,
                groups={n: names for names in plan.groups.values() for n in names},
                allow_empty=begin.adapter.action == pb.ADAPTER_ACTION_REMOVE,
            )
        base = self.base
        offered, why = base.offered(self.gate.version, self.degraded)
        return UpdateAssembler(
            self.manifest,
            self.max_update_bytes,
            self.staging,
            self.gate.version,
            groups=self._groups,
            replayable_version=last.ack.weight_version if last is not None else None,
            keep_refusal=self.keep_refusal,
            placement=Placement(
                staging=self.staging,
                slots=base.offsets if base.enabled else None,
                incoming=self.incoming,
                delta_base=offered,
                no_base_why=why,
                writing=base.writing,
            ),
        )

    async def apply(self, staged: StagedUpdate, receive_s: float) -> pb.UpdateWeightsResponse:
        """Applies a complete, validated update (or recognises a retry of the
        one that installed the served version); counted in the metrics."""
        try:
            ack = await self._apply_or_replay(staged, receive_s)
        except RpcError as e:
            metrics.UPDATES.labels(e.code.name).inc()
            raise
        except asyncio.CancelledError:
            metrics.UPDATES.labels("CANCELLED").inc()
            raise
        metrics.UPDATES.labels("OK").inc()
        metrics.UPDATE_BYTES.inc(ack.bytes_received)
        for phase in ("receive", "apply", "reset"):
            metrics.UPDATE_SECONDS.labels(phase).observe(getattr(ack.timings, f"{phase}_seconds"))
        metrics.WEIGHT_VERSION.info({"version": ack.weight_version})
        return ack

    async def _apply_or_replay(
        self, staged: StagedUpdate, receive_s: float
    ) -> pb.UpdateWeightsResponse:
        self.quiet.check_awake()
        if staged.adapter is not None:
            plan = self._plans.pop(staged.adapter.name)
            assert self.adapters is not None  # as in assembler(): it made the plan
            region = staged.region or self.incoming
            return await asyncio.shield(self.adapters.apply(self.quiet, region, staged, plan))
        if staged.weight_version == self.gate.version:
            return await self._replay(staged)
        if self.degraded and staged.names != set(self.manifest):
            raise FailedPrecondition(
                "the server is degraded: only a full update (every parameter) can recover "
                f"it, this one has {len(staged.names)} of {len(self.manifest)}"
            )
        # Shielded: once the engine is touched, the sequence runs to the end
        # even if the call is cancelled, so the engine is never left paused or
        # half-updated by a client that went away.
        return await asyncio.shield(self._apply(staged, receive_s))

    async def _replay(self, staged: StagedUpdate) -> pb.UpdateWeightsResponse:
        """A stream naming the served version: the original acknowledgement
        if it is a retry of the update that installed it, else refused."""
        last = self._last
        content = await asyncio.to_thread(staged.content)
        if last is None or await last.content != content:
            raise FailedPrecondition(
                f"begin.weight_version: {staged.weight_version!r} is already the served "
                "version, and this stream's tensors differ from the update that installed it",
                reason=pb.ERROR_REASON_VERSION_ALREADY_SERVED,
            )
        log.info("UpdateWeights %r: a retry of the applied update", staged.weight_version)
        ack = pb.UpdateWeightsResponse()
        ack.CopyFrom(last.ack)
        ack.replayed = True
        return ack

    async def _apply(self, staged: StagedUpdate, receive_s: float) -> pb.UpdateWeightsResponse:
        # The region is this update's until it ends (one at a time,
        # update/sessions.py). Its content is read beside the apply, off its
        # critical path (crc32c releases the GIL); awaited before the region
        # is written again.
        self._last = None
        decode_s = 0.0
        if staged.delta is not None:
            # Refused (INVALID_ARGUMENT) with the base put back if a tensor
            # does not decode to its declared CRC-32C.
            t = time.perf_counter()
            await asyncio.to_thread(self.base.materialize, staged.delta)
            decode_s = time.perf_counter() - t
        try:
            ack = await self._load(staged, receive_s)
            ack.timings.decode_seconds = decode_s
            return ack
        except BaseException:
            if staged.delta is not None:
                await asyncio.to_thread(self.base.undo, staged.delta)
            raise

    async def _load(self, staged: StagedUpdate, receive_s: float) -> pb.UpdateWeightsResponse:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        version = staged.weight_version
        content = asyncio.ensure_future(asyncio.to_thread(staged.content))
        async with self.quiet.quiesced(
            staged.pause_mode,
            staged.drain_timeout_seconds,
            on_failure=functools.partial(self._failed, version),
            on_success=functools.partial(self._installed, version, staged),
        ) as quiet:
            previous = self.gate.version
            t_load = time.perf_counter()
            await self.engine.start_weight_update()
            await self.engine.update_weights(
                WeightTransferUpdateRequest(
                    update_info={
                        "shm_name": self.staging.name,
                        "tensors": [t.as_wire() for t in staged.tensors],
                        "broadcast": self._broadcast,
                    }
                )
            )
            if staged.pause_mode == pb.PAUSE_MODE_KEEP:
                # Kept calls' tokens now span two versions.
                self.gate.keep_epoch += 1
            await self.engine.finish_weight_update(weight_version=version)
        t_end = time.perf_counter()
        t0, t_reset = quiet.t0, quiet.t_reset
        log.info(
            "weights %r -> %r: %d tensors, %d bytes, receive %.3fs apply %.3fs reset %.3fs",
            previous,
            version,
            len(staged.tensors),
            staged.bytes_received,
            receive_s,
            t_reset - t0,
            t_end - t_reset,
        )
        ack = pb.UpdateWeightsResponse(
            weight_version=version,
            previous_weight_version=previous,
            bytes_received=staged.bytes_received,
            tensors_loaded=len(staged.tensors),
            caches_reset=quiet.results,
            timings=pb.UpdateTimings(
                receive_seconds=receive_s,
                apply_seconds=t_reset - t0,
                reset_seconds=t_end - t_reset,
                admission_closed_seconds=t_end - t0,
                load_seconds=t_reset - t_load,
            ),
            requests_aborted=quiet.aborted,
        )
        self._last = _Applied(ack=ack, content=content)
        return ack

    async def _installed(self, version: str, staged: StagedUpdate) -> None:
        """The update succeeded (engine resumed, gate not yet reopened)."""
        self.gate.version = version
        self.base.installed(version, staged.names if not staged.base_version else set())
        await self._set_degraded(False)

    async def _failed(self, version: str, e: Exception) -> None:
        """Loading or resetting failed inside the engine: some layers may
        hold the new weights, so no version is claimed and the server is
        degraded (the engine resumes after this)."""
        log.error("weight update %r failed in the engine", version, exc_info=e)
        await self._abandon()
        self.gate.version = ""
        await self._set_degraded(True)
        raise EngineFailure(
            f"loading {version!r} failed inside the engine "
            f"({type(e).__name__}: {e}); the server is degraded until a full "
            "update succeeds"
        ) from e

    async def _abandon(self) -> None:
        """Clears whatever a failed load left in the workers (reload_state.py);
        the backend does it too when loading raises, this covers the rest."""
        try:
            await self.engine.collective_rpc("rollout_abandon_weight_update")
        except Exception:
            log.exception("could not clear the workers' reload state")

    async def _set_degraded(self, degraded: bool) -> None:
        changed = degraded != self.degraded
        self.degraded = degraded
        if changed and self._on_degraded is not None:
            await self._on_degraded(degraded)

    async def _reset_all(self) -> list[pb.CacheResetResult]:
        # tests/test_cache_reset.py calls this; the reset is the quiesce's.
        return await self.quiet.reset_all()

    async def reset_caches(self) -> pb.ResetCachesResponse:
        """ResetCaches: the quiesce with no work in it, only its reset."""
        self.quiet.check_awake()
        return await asyncio.shield(self._reset_caches())

    async def _reset_caches(self) -> pb.ResetCachesResponse:
        async with self.quiet.quiesced() as quiet:
            pass
        return pb.ResetCachesResponse(
            results=quiet.results, duration_seconds=time.perf_counter() - quiet.t0
        )
