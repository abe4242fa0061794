"""The quiesce: the one sequence in which the engine is touched.

Take the lock (one such step at a time), close the gate (new Generate calls
wait there), drain the calls already admitted (gate.py), pause the engine,
do the work, reset every cache, resume, reopen the gate. The work ends with
the reset itself (`Quiescer.reset`), so that the promise is in the function
a reader looks at (base_weights.py's `_load`); a block that ends without
it raises instead of resuming on stale caches. Base weight updates
(WAIT, ABORT and KEEP), LoRA adapter switches, ResetCaches and Sleep all
enter `Quiescer.quiesced`; what differs between them is a parameter:

- `pause_mode`: WAIT drains, bounded by a deadline past which the stragglers
  are aborted; ABORT aborts at once. Both then pause vLLM in its "abort"
  mode, a safety net with nothing left running. KEEP drains nothing: vLLM's
  "keep" pause freezes the running requests where they are, and the reset
  preempts them so that their KV is recomputed under the new weights.
- `installs`: the weight version the work loads (base updates). If the
  work or the reset fails, the engine may hold half-loaded weights: before
  it resumes, the workers' reload state is cleared and the server marked
  degraded (engine/served.py), and EngineFailure (INTERNAL) is raised; if both
  succeed, the version is installed once the engine has resumed, before the
  gate reopens, so that the next calls are tagged with it. Work that fails
  with EngineRestored has put the engine back on the very weights it served
  (a refused delta, delta_load.py): nothing is reset or installed, the
  engine resumes and its error is raised.
- `sleep`: the work puts the engine to sleep. vLLM's sleep pauses the
  scheduler and clears the caches itself and its wake_up resumes it, so
  neither is done here; the gate stays closed, and the Quiescer asleep,
  until `woken()`.

Every cache is reset: the prefix/KV cache (a configured KV connector's too),
the multimodal and the encoder cache. A reset that fails raises, so that a
stale cache is never acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from rollout.v1 import rollout_pb2 as pb
from rollout_service.engine import vllm_compat
from rollout_service.engine.gate import AdmissionGate
from rollout_service.ops import metrics
from rollout_service.status.errors import FailedPrecondition, RpcError

log = logging.getLogger(__name__)


class EngineFailure(RpcError):
    """The engine failed while loading: INTERNAL, and the server is degraded."""

    reason = pb.ERROR_REASON_ENGINE_FAILURE


class EngineRestored(Exception):
    """The work was refused and the engine holds the weights it served, bit
    for bit (never loaded, or put back): no cache is stale and no version
    changes. The quiesce raises `error`."""

    def __init__(self, error: RpcError) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass
class Quiesced:
    """What one quiesce did and when, for the caller's acknowledgement
    (timings.py)."""

    # perf_counter() once the lock is held: admission closes from here.
    t0: float
    # Engine requests the drain aborted, and the drain's seconds.
    aborted: int = 0
    drain_s: float = 0.0
    # perf_counter() once the engine is paused, and the pause's seconds.
    t_paused: float = 0.0
    pause_s: float = 0.0
    # Engine requests running when the engine paused: PAUSE_MODE_KEEP
    # carries them across (the other modes drained them: none).
    running: frozenset[str] = frozenset()
    # perf_counter() when the work ended and the reset began.
    t_reset: float = 0.0
    # The engine's resume, after the reset.
    resume_s: float = 0.0
    results: list[pb.CacheResetResult] = field(default_factory=list)
    # PAUSE_MODE_KEEP: the reset preempts the requests kept running.
    keep: bool = False


class Quiescer:
    """The lock every engine-touching step holds, the sequence it runs, and
    the state that sequence can leave behind: asleep."""

    def __init__(
        self,
        engine,
        gate: AdmissionGate,
        kv_connector: bool = False,
        drain_timeout_seconds: float = 120.0,
    ) -> None:
        self.engine = engine
        self.gate = gate
        self.served = gate.served
        self.kv_connector = kv_connector
        # The bound of a WAIT drain (a call may ask for less).
        self.drain_timeout_seconds = drain_timeout_seconds
        self._lock = asyncio.Lock()
        self._asleep = False

    @property
    def asleep(self) -> bool:
        """The engine sleeps: the gate is closed, updates and resets refused."""
        return self._asleep

    def check_awake(self) -> None:
        if self._asleep:
            raise FailedPrecondition(
                "the engine is asleep (Sleep); call WakeUp first", reason=pb.ERROR_REASON_ASLEEP
            )

    @asynccontextmanager
    async def quiesced(
        self,
        pause_mode: int = pb.PAUSE_MODE_WAIT,
        drain_timeout: float = 0.0,
        *,
        installs: str | None = None,
        sleep: bool = False,
    ) -> AsyncIterator[Quiesced]:
        """Runs the block with the gate closed, the admitted calls drained
        and the engine paused; the block ends with `reset` (every cache);
        then the engine resumes, `installs` is installed and the gate
        reopens. The yielded Quiesced is filled in as the sequence goes."""
        keep = pause_mode == pb.PAUSE_MODE_KEEP
        async with self._lock:
            quiesced = Quiesced(t0=time.perf_counter(), keep=keep)
            self.gate.close()
            held = False
            try:
                if not keep:
                    quiesced.aborted = await self.drain(pause_mode, drain_timeout)
                    quiesced.drain_s = time.perf_counter() - quiesced.t0
                if sleep:
                    yield quiesced
                    self._asleep = held = True
                    return
                t_pause = time.perf_counter()
                await vllm_compat.pause_scheduler(self.engine, "keep" if keep else "abort")
                quiesced.t_paused = time.perf_counter()
                quiesced.pause_s = quiesced.t_paused - t_pause
                quiesced.running = self.running_requests()
                try:
                    yield quiesced
                    if not quiesced.results:
                        raise RuntimeError("the work in the quiesce ended without the cache reset")
                except EngineRestored as e:
                    raise e.error from None
                except Exception as e:
                    if installs is not None:
                        await self._failed(installs, e)
                    raise
                finally:
                    # Resumed even after a failure: the engine must not
                    # stay paused.
                    t_resume = time.perf_counter()
                    await self.engine.resume_generation()
                    quiesced.resume_s = time.perf_counter() - t_resume
                if installs is not None:
                    await self.served.install(installs)
            finally:
                if not held:
                    self.gate.open()

    async def _failed(self, version: str, e: Exception) -> None:
        """Loading or resetting `version` failed inside the engine (paused):
        some layers may hold the new weights, so no version is claimed and
        the server is degraded."""
        log.error("weight update %r failed in the engine", version, exc_info=e)
        try:
            # What a failed load left in the workers (reload_state.py); the
            # backend clears it too when loading raises, this covers the rest.
            await self.engine.collective_rpc("rollout_abandon_weight_update")
        except Exception:
            log.exception("could not clear the workers' reload state")
        await self.served.lose(f"loading {version!r} failed inside the engine")
        raise EngineFailure(
            f"loading {version!r} failed inside the engine "
            f"({type(e).__name__}: {e}); the server is degraded until a full "
            "update succeeds"
        ) from e

    @asynccontextmanager
    async def woken(self) -> AsyncIterator[None]:
        """The end of a sleep: under the lock, the block wakes the engine
        (vLLM's wake_up resumes its scheduler); if it succeeds, the Quiescer
        is awake and the gate reopens. A failed wake-up changes neither."""
        async with self._lock:
            yield
            self._asleep = False
            self.gate.open()

    def running_requests(self) -> frozenset[str]:
        """The engine requests of admitted calls that the engine still runs."""
        return self.gate.engine_requests(lambda eid: vllm_compat.request_running(self.engine, eid))

    async def drain(self, pause_mode: int, drain_timeout: float = 0.0) -> int:
        """Drains admitted calls (gate closed); returns how many engine
        requests it aborted.

        WAIT past its deadline falls back to ABORT rather than failing the
        update: the trainer asked for new weights, and a request that
        outlives the deadline is a straggler it would rather drop than wait
        for (its partial tokens still come back, tagged with the old version).
        """
        if pause_mode == pb.PAUSE_MODE_ABORT:
            abort_after = 0.0
        else:
            limit = self.drain_timeout_seconds
            abort_after = min(drain_timeout, limit) if drain_timeout else limit
        aborted = await self.gate.drain(
            engine_running=lambda eid: vllm_compat.request_running(self.engine, eid),
            abort=self.engine.abort,
            abort_after=abort_after,
        )
        if aborted and pause_mode != pb.PAUSE_MODE_ABORT:
            log.warning(
                "drain deadline (%.1fs) passed: aborted %d in-flight requests", abort_after, aborted
            )
        return aborted

    async def reset(self, quiesced: Quiesced) -> None:
        """The last step of the work inside `quiesced` (the engine paused):
        every cache reset, with what was reset recorded for the ack."""
        quiesced.t_reset = time.perf_counter()
        quiesced.results = await self.reset_all(preempt_running=quiesced.keep)

    async def reset_all(self, preempt_running: bool = False) -> list[pb.CacheResetResult]:
        """Resets every cache (engine paused); any failure raises.

        `preempt_running` (PAUSE_MODE_KEEP): requests kept across the update
        hold KV blocks computed with the old weights; vLLM preempts them back
        to its waiting queue, dropping their KV, so that their prompt and
        tokens so far are recomputed under the new weights before their next
        token (the same recompute path as a preemption for memory)."""
        if not await self.engine.reset_prefix_cache(
            reset_running_requests=preempt_running, reset_connector=self.kv_connector
        ):
            raise RuntimeError("the engine refused to reset the prefix cache")
        await self.engine.reset_mm_cache()
        await self.engine.reset_encoder_cache()
        kinds = [pb.CACHE_KIND_PREFIX, pb.CACHE_KIND_MULTIMODAL, pb.CACHE_KIND_ENCODER]
        if self.kv_connector:
            kinds.append(pb.CACHE_KIND_KV_CONNECTOR)
        for kind in kinds:
            metrics.CACHE_RESETS.labels(
                pb.CacheKind.Name(kind).removeprefix("CACHE_KIND_").lower()
            ).inc()
        return [pb.CacheResetResult(cache=kind, reset=True) for kind in kinds]
