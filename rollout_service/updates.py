"""UpdateWeights and ResetCaches: the atomic apply-and-reset sequence.

Receive: the stream is assembled and validated in the staging region while
generation goes on. Apply, as one step that a cancelled call cannot cut in
half: close admission, drain admitted calls (WAIT) or abort them (ABORT),
pause the engine, load the staged tensors through vLLM's weight-transfer API,
reset the prefix/KV, multimodal and encoder caches, resume, reopen admission
on the new version. Only then is the update acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import time

from rollout.v1 import rollout_pb2 as pb
from rollout_service import metrics
from rollout_service.assembler import StagedUpdate, UpdateAssembler
from rollout_service.errors import Aborted, FailedPrecondition, RpcError
from rollout_service.gate import AdmissionGate
from rollout_service.staging import StagingRegion
from rollout_service.weights_backend import BACKEND_NAME

log = logging.getLogger(__name__)


class EngineFailure(RpcError):
    """The engine failed while loading: INTERNAL, and the server is degraded."""


class WeightUpdater:
    """Owns the staging region, the degraded state and the apply sequence."""

    def __init__(
        self,
        engine,
        gate: AdmissionGate,
        manifest: dict[str, pb.TensorSpec],
        max_update_bytes: int,
        on_degraded=None,
    ) -> None:
        self.engine = engine
        # Called with True when an update fails inside the engine, False when
        # a full update recovers (the server ties health to it).
        self._on_degraded = on_degraded
        self.gate = gate
        self.manifest = manifest
        self.max_update_bytes = max_update_bytes
        self.staging = StagingRegion()
        # Set when an engine failure may have left weights half-loaded.
        self.degraded = False
        self._busy = False
        # Serialises the engine-touching step of updates and cache resets.
        self._apply_lock = asyncio.Lock()

    async def start(self, prefault_bytes: int = 0) -> None:
        """Initialises the weight-transfer backend in the workers."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        await self.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info={}))
        if prefault_bytes:
            self.staging.ensure(prefault_bytes, prefault=True)
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

    async def update(self, messages) -> pb.UpdateWeightsResponse:
        """Receives one UpdateWeights stream, then applies it."""
        try:
            ack = await self._update(messages)
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

    async def _update(self, messages) -> pb.UpdateWeightsResponse:
        # Busy from the first message to the end of the apply, so that a
        # concurrent update is refused at once in either phase, never queued.
        if self._busy:
            raise Aborted("another UpdateWeights is in progress; only one runs at a time")
        self._busy = True
        apply = None
        try:
            t0 = time.perf_counter()
            staged = await self._receive(messages)
            receive_s = time.perf_counter() - t0
            if self.degraded and staged.names != set(self.manifest):
                raise FailedPrecondition(
                    "the server is degraded: only a full update (every parameter) can recover "
                    f"it, this one has {len(staged.names)} of {len(self.manifest)}"
                )
            # Shielded: once the engine is touched, the sequence runs to the
            # end even if the call is cancelled, so the engine is never left
            # paused or half-updated by a client that went away; the update
            # stays busy until it has.
            apply = asyncio.ensure_future(self._apply(staged, receive_s))
            apply.add_done_callback(lambda _: setattr(self, "_busy", False))
            return await asyncio.shield(apply)
        finally:
            if apply is None:
                self._busy = False

    async def _receive(self, messages) -> StagedUpdate:
        assembler = UpdateAssembler(
            self.manifest, self.max_update_bytes, self.staging, self.gate.version
        )
        async for msg in messages:
            if hasattr(msg, "fail"):  # servicer.Malformed: bytes that did not parse
                msg.fail()
            assembler.feed(msg)
        return assembler.finish()

    async def _apply(self, staged: StagedUpdate, receive_s: float) -> pb.UpdateWeightsResponse:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        async with self._apply_lock:
            previous = self.gate.version
            t0 = time.perf_counter()
            async with self.gate.closed():
                await self._drain(staged.pause_mode)
                await self._pause_engine()
                try:
                    t_load = time.perf_counter()
                    await self.engine.start_weight_update()
                    await self.engine.update_weights(
                        WeightTransferUpdateRequest(
                            update_info={
                                "shm_name": self.staging.name,
                                "tensors": staged.tensors,
                            }
                        )
                    )
                    await self.engine.finish_weight_update(weight_version=staged.weight_version)
                    t_reset = time.perf_counter()
                    results = await self._reset_all()
                except Exception as e:
                    log.exception("weight update %r failed in the engine", staged.weight_version)
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
        return pb.UpdateWeightsResponse(
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
        )

    async def _pause_engine(self) -> None:
        """Pauses the scheduler; nothing is running (the gate has drained
        every admitted call), so this is a safety net that also holds back
        anything that slipped in.

        AsyncLLM.pause_generation(clear_cache=False) is this same call plus a
        fixed 20 ms sleep that only orders in-flight outputs for its caller;
        with nothing in flight it is pure latency on the update's critical path.
        """
        core = getattr(self.engine, "engine_core", None)
        if core is not None and hasattr(core, "pause_scheduler_async"):
            await core.pause_scheduler_async(mode="abort", clear_cache=False)
        else:
            await self.engine.pause_generation(mode="abort", clear_cache=False)

    async def _set_degraded(self, degraded: bool) -> None:
        changed = degraded != self.degraded
        self.degraded = degraded
        if changed and self._on_degraded is not None:
            await self._on_degraded(degraded)

    async def _drain(self, pause_mode: int) -> None:
        if pause_mode == pb.PAUSE_MODE_ABORT:
            await self.gate.drain(abort=self.engine.abort)
        else:
            await self.gate.drain()

    async def _reset_all(self) -> list[pb.CacheResetResult]:
        """Resets the three caches (engine paused, nothing running); any
        failure raises, so that a stale cache is never acknowledged."""
        if not await self.engine.reset_prefix_cache():
            raise RuntimeError("the engine refused to reset the prefix cache")
        await self.engine.reset_mm_cache()
        await self.engine.reset_encoder_cache()
        for cache in ("prefix", "multimodal", "encoder"):
            metrics.CACHE_RESETS.labels(cache).inc()
        return [
            pb.CacheResetResult(cache=kind, reset=True)
            for kind in (pb.CACHE_KIND_PREFIX, pb.CACHE_KIND_MULTIMODAL, pb.CACHE_KIND_ENCODER)
        ]

    async def reset_caches(self) -> pb.ResetCachesResponse:
        """ResetCaches: the same gate, drain, pause, reset, resume sequence."""
        return await asyncio.shield(self._reset_caches())

    async def _reset_caches(self) -> pb.ResetCachesResponse:
        async with self._apply_lock:
            t0 = time.perf_counter()
            async with self.gate.closed():
                await self.gate.drain()
                await self._pause_engine()
                try:
                    results = await self._reset_all()
                finally:
                    await self.engine.resume_generation()
            return pb.ResetCachesResponse(
                results=results, duration_seconds=time.perf_counter() - t0
            )
