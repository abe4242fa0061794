"""UpdateWeights and ResetCaches: the atomic apply-and-reset sequence.

Receive: the stream is assembled and validated in the staging region while
generation goes on. Apply, as one step that a cancelled call cannot cut in
half: close admission, drain admitted calls (WAIT, bounded by a deadline
past which they are aborted) or abort them (ABORT), pause the engine, load
the staged tensors through vLLM's weight-transfer API, reset the prefix/KV
(and KV connector), multimodal and encoder caches, resume, reopen admission
on the new version. Only then is the update acknowledged.

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
(update_sessions.py), then is recognised the same way.

Receiving (one UpdateWeights stream, or a staged update's uploads) is
update_sessions.py's; this module takes a complete update from there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from rollout.v1 import rollout_pb2 as pb
from rollout_service import metrics
from rollout_service.assembler import StagedUpdate, UpdateAssembler
from rollout_service.errors import FailedPrecondition, RpcError
from rollout_service.gate import AdmissionGate
from rollout_service.staging import StagingRegion
from rollout_service.weights_backend import BACKEND_NAME

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
    """Owns the staging region, the degraded state and the apply sequence."""

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
        self._kv_connector = kv_connector
        self.drain_timeout_seconds = drain_timeout_seconds
        # Workers other than the first get the tensors over the engine's
        # process group instead of from the region (weights_backend.py).
        self._broadcast = broadcast
        # Reserved by the server before the engine started (reservation.py).
        self.staging = staging or StagingRegion()
        # Set when an engine failure may have left weights half-loaded.
        self.degraded = False
        # Why PAUSE_MODE_KEEP is refused on this server (None: accepted).
        self.keep_refusal = keep_refusal
        self._last: _Applied | None = None
        # Serialises the engine-touching step of updates and cache resets.
        self._apply_lock = asyncio.Lock()
        # Set while the engine sleeps (sleep.py): updates and resets refused.
        self.asleep = False
        # LoRA adapters (lora.py; set by the server), and the plan of each
        # open adapter update, by adapter name.
        self.adapters = None
        self._plans: dict = {}

    def engine_step(self):
        """The lock every engine-touching sequence holds (updates, cache
        resets, sleep): one at a time."""
        return self._apply_lock

    def check_awake(self) -> None:
        if self.asleep:
            raise FailedPrecondition(
                "the engine is asleep (Sleep); call WakeUp first", reason=pb.ERROR_REASON_ASLEEP
            )

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
        self.staging.close()

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
            plan = self.adapters.plan(begin)
            self._plans[begin.adapter.name] = plan
            return UpdateAssembler(
                plan.manifest,
                self.max_update_bytes,
                self.staging,
                plan.current_version,
                groups={n: names for names in plan.groups.values() for n in names},
                allow_empty=begin.adapter.action == pb.ADAPTER_ACTION_REMOVE,
            )
        return UpdateAssembler(
            self.manifest,
            self.max_update_bytes,
            self.staging,
            self.gate.version,
            groups=self._groups,
            replayable_version=last.ack.weight_version if last is not None else None,
            keep_refusal=self.keep_refusal,
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
        self.check_awake()
        if staged.adapter is not None:
            return await asyncio.shield(
                self.adapters.apply(self, staged, self._plans.pop(staged.adapter.name))
            )
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
        content = await asyncio.to_thread(staged.content, self.staging.ensure(0))
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
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        async with self._apply_lock:
            previous = self.gate.version
            # Read beside the apply, off its critical path (crc32c releases
            # the GIL); awaited before the region is written again.
            content = asyncio.ensure_future(
                asyncio.to_thread(staged.content, self.staging.ensure(0))
            )
            self._last = None
            t0 = time.perf_counter()
            keep = staged.pause_mode == pb.PAUSE_MODE_KEEP
            async with self.gate.closed():
                aborted = 0
                if not keep:
                    aborted = await self.drain_for(staged.pause_mode, staged.drain_timeout_seconds)
                await self._pause_engine(keep)
                try:
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
                    if keep:  # kept calls' tokens now span two versions
                        self.gate.keep_epoch += 1
                    await self.engine.finish_weight_update(weight_version=staged.weight_version)
                    t_reset = time.perf_counter()
                    results = await self._reset_all(preempt_running=keep)
                except Exception as e:
                    log.exception("weight update %r failed in the engine", staged.weight_version)
                    await self._abandon()
                    # No version is claimed for weights that may be mixed.
                    self.gate.version = ""
                    await self._set_degraded(True)
                    raise EngineFailure(
                        f"loading {staged.weight_version!r} failed inside the engine "
                        f"({type(e).__name__}: {e}); the server is degraded until a full "
                        "update succeeds"
                    ) from e
                finally:
                    # Resumed even after a failure: generation stays refused
                    # while degraded, but the engine must not stay paused.
                    await self.engine.resume_generation()
                self.gate.version = staged.weight_version
                await self._set_degraded(False)
            t_end = time.perf_counter()
        log.info(
            "weights %r -> %r: %d tensors, %d bytes, receive %.3fs apply %.3fs reset %.3fs",
            previous,
            staged.weight_version,
            len(staged.tensors),
            staged.bytes_received,
            receive_s,
            t_reset - t0,
            t_end - t_reset,
        )
        ack = pb.UpdateWeightsResponse(
            weight_version=staged.weight_version,
            previous_weight_version=previous,
            bytes_received=staged.bytes_received,
            tensors_loaded=len(staged.tensors),
            caches_reset=results,
            timings=pb.UpdateTimings(
                receive_seconds=receive_s,
                apply_seconds=t_reset - t0,
                reset_seconds=t_end - t_reset,
                admission_closed_seconds=t_end - t0,
                load_seconds=t_reset - t_load,
            ),
            requests_aborted=aborted,
        )
        self._last = _Applied(ack=ack, content=content)
        return ack

    async def _abandon(self) -> None:
        """Clears whatever a failed load left in the workers (reload_state.py);
        the backend does it too when loading raises, this covers the rest."""
        try:
            await self.engine.collective_rpc("rollout_abandon_weight_update")
        except Exception:
            log.exception("could not clear the workers' reload state")

    async def _pause_engine(self, keep: bool = False) -> None:
        """Pauses the scheduler. Without `keep` nothing is running (the gate
        has drained every admitted call), so this is a safety net that also
        holds back anything that slipped in. With `keep` the running requests
        are frozen where they are (vLLM's "keep" mode: no step runs until
        resume), to continue on the new weights.

        AsyncLLM.pause_generation(clear_cache=False) is this same call plus a
        fixed 20 ms sleep that only orders in-flight outputs for its caller;
        with nothing in flight it is pure latency on the update's critical path.
        """
        mode = "keep" if keep else "abort"
        core = getattr(self.engine, "engine_core", None)
        if core is not None and hasattr(core, "pause_scheduler_async"):
            await core.pause_scheduler_async(mode=mode, clear_cache=False)
        else:
            await self.engine.pause_generation(mode=mode, clear_cache=False)

    async def _set_degraded(self, degraded: bool) -> None:
        changed = degraded != self.degraded
        self.degraded = degraded
        if changed and self._on_degraded is not None:
            await self._on_degraded(degraded)

    async def drain_for(self, pause_mode: int, drain_timeout: float = 0.0) -> int:
        """Drains admitted calls; returns how many engine requests it aborted.

        WAIT past its deadline falls back to ABORT rather than failing the
        update: the trainer asked for new weights, and a request that
        outlives the deadline is a straggler it would rather drop than wait
        for (its partial tokens still come back, tagged with the old version).
        """
        outputs = self.engine.output_processor
        if pause_mode == pb.PAUSE_MODE_ABORT:
            abort_after = 0.0
        else:
            limit = self.drain_timeout_seconds
            abort_after = min(drain_timeout, limit) if drain_timeout else limit
        aborted = await self.gate.drain(
            engine_running=lambda eid: eid in outputs.external_req_ids,
            abort=self.engine.abort,
            abort_after=abort_after,
        )
        if aborted and pause_mode != pb.PAUSE_MODE_ABORT:
            log.warning(
                "drain deadline (%.1fs) passed: aborted %d in-flight requests", abort_after, aborted
            )
        return aborted

    async def _reset_all(self, preempt_running: bool = False) -> list[pb.CacheResetResult]:
        """Resets every cache (engine paused), a configured KV connector's
        too; any failure raises, so that a stale cache is never acknowledged.

        `preempt_running` (PAUSE_MODE_KEEP): requests kept across the update
        hold KV blocks computed with the old weights; vLLM preempts them back
        to its waiting queue, dropping their KV, so that their prompt and
        tokens so far are recomputed under the new weights before their next
        token (the same recompute path as a preemption for memory)."""
        if not await self.engine.reset_prefix_cache(
            reset_running_requests=preempt_running, reset_connector=self._kv_connector
        ):
            raise RuntimeError("the engine refused to reset the prefix cache")
        await self.engine.reset_mm_cache()
        await self.engine.reset_encoder_cache()
        kinds = [pb.CACHE_KIND_PREFIX, pb.CACHE_KIND_MULTIMODAL, pb.CACHE_KIND_ENCODER]
        if self._kv_connector:
            kinds.append(pb.CACHE_KIND_KV_CONNECTOR)
        for kind in kinds:
            metrics.CACHE_RESETS.labels(
                pb.CacheKind.Name(kind).removeprefix("CACHE_KIND_").lower()
            ).inc()
        return [pb.CacheResetResult(cache=kind, reset=True) for kind in kinds]

    async def reset_caches(self) -> pb.ResetCachesResponse:
        """ResetCaches: the same gate, drain, pause, reset, resume sequence."""
        self.check_awake()
        return await asyncio.shield(self._reset_caches())

    async def reset_paused(self) -> list[pb.CacheResetResult]:
        """Pauses the engine, resets every cache, resumes (call drained,
        behind the gate and the lock)."""
        await self._pause_engine()
        try:
            return await self._reset_all()
        finally:
            await self.engine.resume_generation()

    async def _reset_caches(self) -> pb.ResetCachesResponse:
        async with self._apply_lock:
            t0 = time.perf_counter()
            async with self.gate.closed():
                await self.drain_for(pb.PAUSE_MODE_WAIT)
                results = await self.reset_paused()
            return pb.ResetCachesResponse(
                results=results, duration_seconds=time.perf_counter() - t0
            )
