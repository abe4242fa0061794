"""The server behind one verl rollout replica: a Ray actor (ServiceReplica
starts it) that answers verl's token-in, token-out `generate` from the
rollout service instead of a vLLM engine of its own.

Every call is pinned (`required_weight_version`) to the version the leader
trainer rank pushed last (`set_version`, called after the push's
acknowledgement). `extra_fields["global_steps"]` is the step of the version
that produced the tokens.

A weight sync never fails a call. A call refused because the served version
moved past its pin (it left here before the pin moved, or during our push)
comes back as verl resumes: `stop_reason="aborted"` with the tokens it made
(none: the service refuses before the first), and verl's
FullyAsyncLLMServerClient resumes it under the new pin within the same
budget. Only weights that moved behind the trainer's back (no push of ours
pending, the pin unchanged) fail the call. A call that verl's abort did not
find at the service (still on its way there) is cancelled and comes back
aborted; the abort counts only what the service found.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import grpc

from rollout.v1 import rollout_pb2 as pb
from rollout_client.client import AsyncRolloutClient, RolloutError
from rollout_client.verl.routing import Router
from rollout_client.verl.sampling import sampling_kwargs, step_of
from rollout_client.verl.settings import Settings
from rollout_codecs import extras

log = logging.getLogger(__name__)

_STOP_REASONS = {
    pb.FINISH_REASON_STOP: "completed",
    pb.FINISH_REASON_LENGTH: "completed",
    pb.FINISH_REASON_ABORT: "aborted",
}


@dataclass
class _Flight:
    """A call that left this server: which service, and its gRPC call."""

    service: int
    task: asyncio.Task[pb.GenerateResponse]


@dataclass
class Stats:
    """What this server did that verl does not see (`stats()`)."""

    calls: list[int] = field(default_factory=list)  # per service, routed
    refused_then_aborted: int = 0  # WRONG_WEIGHT_VERSION returned as aborted
    cancelled_in_transit: int = 0  # missed by an abort, cancelled
    aborted: int = 0  # found at the service by verl's abort (returned their tokens)
    rerouted: int = 0  # moved off a service that did not answer


def _cancelled_from_outside() -> bool:
    """The running task itself is being cancelled (Ray, verl), not a call of
    ours that an abort cancelled."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class ServiceServer:
    """One replica's server (a Ray actor: ServiceReplica wraps it with
    ray.remote). What verl calls on it and what each does here:

    - `generate`: one Generate, pinned to the version set last, on the
      service that holds the call's prefix (routing.Router);
    - `set_version` / `set_global_steps`: the version to pin to (the rollout
      adapter calls `begin_push` before its push and set_version after the
      acknowledgement);
    - `clear_kv_cache`: ResetCaches (every update already resets the prefix,
      multimodal and encoder caches itself);
    - `abort_all_requests` / `resume_generation`: close this server's gate
      and Abort its running calls (they return their partial tokens,
      stop_reason "aborted"), then reopen it;
    - `sleep`, `wake_up`, `release_kv_cache`, `resume_kv_cache`,
      `start_profile`, `stop_profile`: no-ops (the engine's memory is the
      service's, not the trainer's GPU)."""

    def __init__(
        self,
        config: Any,
        settings: Settings,
        replica_rank: int = 0,
        full_determinism: bool = False,
    ) -> None:
        self.config = config
        self.settings = settings
        self.replica_rank = replica_rank
        self.seed = (replica_rank + int(getattr(config, "seed", 0))) if full_determinism else None
        self.version: str | None = None  # what every call requires (None: nothing pushed yet)
        self.step: int | None = None
        self._steps: dict[str, int | None] = {}  # every version pinned: its step
        self._pending: str | None = None  # a push of ours under way
        self._pin_moved = asyncio.Event()  # set (and replaced) when the pin moves
        self._clients: list[AsyncRolloutClient] | None = None
        self._router = Router(len(settings.targets), offset=replica_rank)
        self._stats = Stats(calls=self._router.calls)
        self._max_model_len = 0
        self._running: dict[str, _Flight] = {}  # request id -> its call
        self._cut: set[str] = set()  # cancelled by an abort that missed them
        self._idle = asyncio.Event()  # set while nothing runs
        self._idle.set()
        self._open = asyncio.Event()
        self._open.set()
        self._rejecting = False

    async def _services(self) -> list[AsyncRolloutClient]:
        # grpc.aio channels belong to the loop that made them: the actor's.
        if self._clients is None:
            s = self.settings
            self._clients = [
                AsyncRolloutClient(t, timeout=s.timeout, **s.client_options()) for t in s.targets
            ]
            info = await self._clients[0].server_info()
            self._max_model_len = int(info.max_model_len)
        return self._clients

    def get_server_address(self) -> str:
        return f"{','.join(self.settings.targets)}#replica-{self.replica_rank}"

    # -- the pin -----------------------------------------------------------

    def _move_pin(self, version: str | None, step: int | None) -> None:
        if version is not None:
            self._steps[version] = step
        self.version, self.step, self._pending = version, step, None
        self._pin_moved.set()
        self._pin_moved = asyncio.Event()

    async def begin_push(self, version: str) -> None:
        """A push of ours is under way: calls refused meanwhile wait for
        the new pin instead of failing."""
        self._pending = version

    async def end_push(self) -> None:
        """The push failed: the pin stays (calls waiting for it fail)."""
        self._pending = None
        self._pin_moved.set()
        self._pin_moved = asyncio.Event()

    async def set_version(self, version: str, step: int | None) -> None:
        self._move_pin(version, step)

    async def set_global_steps(self, global_steps: int) -> None:
        """verl's name for it: the version f"{prefix}{global_steps}" when the
        prefix is configured; otherwise only the step that is reported."""
        prefix = self.settings.version_prefix
        if prefix is not None:
            self._move_pin(f"{prefix}{global_steps}", global_steps)
        else:
            self.step = global_steps

    async def get_version(self) -> tuple[str | None, int | None]:
        return self.version, self.step

    async def get_settings(self) -> Settings:
        """rollout.custom as this replica read it (the checkpoint-engine
        backend's master rank reads it here)."""
        return self.settings

    # -- the rollout side of checkpoint_engine.ServiceCheckpointEngine -----
    # (verl's CheckpointEngineManager calls these on the replica's workers:
    # this server is its replica's one worker)

    async def execute_checkpoint_engine(self, method: str, *args: Any, **kwargs: Any) -> Any:
        from rollout_client.verl.checkpoint_engine import ServiceCheckpointEngine

        return getattr(ServiceCheckpointEngine(), method)(*args, **kwargs)

    async def update_weights(self, global_steps: int | None = None) -> None:
        """Nothing to receive: the service loads the weights, and the master
        trainer rank moves this server's pin after the acknowledgement."""

    async def _pin_moves_from(self, pin: str | None) -> bool:
        """After a WRONG_WEIGHT_VERSION refusal of a call pinned to `pin`:
        whether the pin has moved on or does once our pending push is
        acknowledged (False: the weights moved behind the trainer's back)."""
        if self.version != pin:
            return True
        if self._pending is None:
            return False
        moved = self._pin_moved
        try:
            await asyncio.wait_for(moved.wait(), self.settings.timeout)
        except TimeoutError:
            return False
        return self.version != pin

    def _step(self, version: str) -> int | None:
        if version in self._steps:
            return self._steps[version]
        return step_of(version, self.settings.version_prefix)

    # -- generation --------------------------------------------------------

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
        audio_data: list[Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        priority: int = 0,
        **kwargs: Any,
    ) -> Any:
        if image_data or video_data or audio_data:
            raise NotImplementedError("rollout_service: multimodal prompts are not passed on yet")
        want_logprobs = bool(sampling_params.get("logprobs", False))
        if not self._open.is_set():
            if self._rejecting:
                return self._aborted(want_logprobs)
            await self._open.wait()
        services = await self._services()
        ids = [int(t) for t in prompt_ids]
        kw, want_logprobs = sampling_kwargs(
            sampling_params, len(ids), self.config, self._max_model_len, self.seed
        )
        pin = self.version
        tried: list[int] = []
        while True:
            i = self._router.pick(ids, avoid=tried)
            call = services[i].generate(
                prompt_token_ids=ids, request_id=request_id, required_weight_version=pin or "", **kw
            )
            task = asyncio.ensure_future(call)
            self._running[request_id] = _Flight(i, task)
            self._idle.clear()
            self._router.start(i)
            output: list[int] = []
            try:
                r = await task
                output = list(r.completions[0].token_ids)
                break
            except asyncio.CancelledError:
                if request_id in self._cut and not _cancelled_from_outside():
                    self._stats.cancelled_in_transit += 1
                    return self._aborted(want_logprobs)
                raise
            except RolloutError as e:
                if e.code == grpc.StatusCode.UNAVAILABLE and len(tried) + 1 < len(services):
                    target = self.settings.targets[i]
                    log.warning("rollout_service: %s lost (%s); rerouting", target, e)
                    self._router.lost(i)
                    self._stats.rerouted += 1
                    tried.append(i)
                    continue
                if e.reason == "WRONG_WEIGHT_VERSION" and await self._pin_moves_from(pin):
                    self._stats.refused_then_aborted += 1
                    return self._aborted(want_logprobs)
                # RolloutError does not cross Ray (it does not pickle): its
                # reason leads the message.
                raise RuntimeError(f"rollout_service: {e.reason}: {e}") from None
            finally:
                self._router.finish(i, ids, output)
                del self._running[request_id]
                self._cut.discard(request_id)
                if not self._running:
                    self._idle.set()
        return self._output(r, want_logprobs)

    def _aborted(self, want_logprobs: bool) -> Any:
        """What verl resumes: aborted, no tokens. Its step is None: no
        weights produced it (verl's fully-async client takes the first step
        it is given as the call's min_global_steps)."""
        replica = extras.require("verl.workers.rollout.replica", "rollout_client.verl", "verl")
        return replica.TokenOutput(
            token_ids=[],
            log_probs=[] if want_logprobs else None,
            stop_reason="aborted",
            extra_fields={"global_steps": None},
        )

    def _output(self, r: pb.GenerateResponse, want_logprobs: bool) -> Any:
        """The service's answer as verl's TokenOutput; a PAUSE_MODE_KEEP
        update during the call gives it several versions: the first and
        last steps are verl's min_ and max_global_steps."""
        replica = extras.require("verl.workers.rollout.replica", "rollout_client.verl", "verl")
        c = r.completions[0]
        versions = [s.weight_version for s in c.version_spans if s.count] or [r.weight_version]
        steps = [self._step(v) for v in versions]
        return replica.TokenOutput(
            token_ids=list(c.token_ids),
            log_probs=list(c.logprobs) if want_logprobs else None,
            stop_reason=_STOP_REASONS.get(c.finish_reason),
            extra_fields={
                "global_steps": steps[-1],
                "min_global_steps": steps[0],
                "max_global_steps": steps[-1],
                "weight_version": versions[-1],
                "weight_versions": versions,
                "num_cached_tokens": r.usage.cached_prompt_tokens,
            },
        )

    # -- verl's other calls ------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        return {**self._stats.__dict__, "targets": list(self.settings.targets)}

    async def clear_kv_cache(self) -> None:
        await asyncio.gather(*(c.reset_caches() for c in await self._services()))

    async def _abort(self, request_ids: list[str]) -> dict[str, Any]:
        """Abort at the service; what it did not find and is still on its
        way there is cancelled here (it comes back aborted)."""
        services = await self._services()
        by_service: dict[int, list[str]] = {}
        for rid in request_ids:
            if (f := self._running.get(rid)) is not None:
                by_service.setdefault(f.service, []).append(rid)
        answers = await asyncio.gather(*(services[i].abort(r) for i, r in by_service.items()))
        found = {rid for a in answers for rid in a.request_ids}
        self._stats.aborted += len(found)
        missed = []
        for rid in request_ids:
            f = self._running.get(rid)
            if rid not in found and f is not None and not f.task.done():
                self._cut.add(rid)
                f.task.cancel()
                missed.append(rid)
        return {"request_ids": sorted(found), "cancelled_in_transit": missed}

    async def abort_all_requests(
        self, reset_prefix_cache: bool = True, reject_request: bool = False
    ) -> dict[str, Any]:
        self._open.clear()
        self._rejecting = reject_request
        done = await self._abort(list(self._running))
        return {"aborted_count": len(done["request_ids"]), **done}

    async def abort_request(
        self, request_id: str, reset_prefix_cache: bool = True
    ) -> dict[str, Any]:
        if request_id not in self._running:
            return {"aborted": False, "request_id": request_id, "error": "not running"}
        done = await self._abort([request_id])
        aborted = bool(done["request_ids"] or done["cancelled_in_transit"])
        return {"aborted": aborted, "request_id": request_id, **done}

    async def resume_generation(self) -> None:
        self._rejecting = False
        self._open.set()

    async def wait_for_requests_to_drain(self) -> None:
        await self._idle.wait()

    async def sleep(self) -> None:
        """No-op: the service's memory is not the trainer's."""

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """No-op (see sleep)."""

    async def release_kv_cache(self) -> None:
        """No-op (see sleep)."""

    async def resume_kv_cache(self) -> None:
        """No-op (see sleep)."""

    async def start_profile(self, **kwargs: Any) -> None:
        """No-op: profile the service with its own tools."""

    async def stop_profile(self) -> None:
        """No-op (see start_profile)."""
