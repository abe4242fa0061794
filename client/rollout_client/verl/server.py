"""The server behind one verl rollout replica: a Ray actor (ServiceReplica
starts it) that answers verl's token-in, token-out `generate` from the
rollout service instead of a vLLM engine of its own.

Every call is pinned (`required_weight_version`) to the version the leader
trainer rank pushed last (`set_version`, called after the push's
acknowledgement): a server on any other weights refuses it before producing
a token, and the call fails loudly. `extra_fields["global_steps"]` is the
step of the version that produced the tokens.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Mapping
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_client.client import AsyncRolloutClient, RolloutError
from rollout_client.verl.settings import Settings
from rollout_codecs import extras

log = logging.getLogger(__name__)

# verl's sampling_params keys and ours (SamplingParams fields).
_SAME = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "min_tokens",
    "stop",
    "stop_token_ids",
    "ignore_eos",
)
# vLLM SamplingParams fields with no counterpart that change no token id:
# dropped (the service returns ids and, once decoded, text).
_IGNORED = (
    "detokenize",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "output_kind",
)
_STOP_REASONS = {
    pb.FINISH_REASON_STOP: "completed",
    pb.FINISH_REASON_LENGTH: "completed",
    pb.FINISH_REASON_ABORT: "aborted",
}


def step_of(version: str, prefix: str | None) -> int | None:
    """The global step a version pushed under `prefix` names (None: another's)."""
    if prefix is None or not version.startswith(prefix):
        return None
    tail = version[len(prefix) :]
    return int(tail) if tail.isdigit() else None


def sampling_kwargs(
    params: Mapping[str, Any],
    prompt_len: int,
    config: Any,
    max_model_len: int = 0,
    seed: int | None = None,
) -> tuple[dict[str, Any], bool]:
    """verl's sampling_params as Generate's keyword arguments, and whether
    logprobs were asked for. max_tokens defaults as verl's vLLM server sets
    it: the response length, within prompt_length + response_length and the
    served context."""
    p = dict(params)
    max_tokens = p.pop("max_tokens", p.pop("max_new_tokens", None))
    if max_tokens is None:
        response_length = int(config.response_length)
        max_tokens = min(response_length, int(config.prompt_length) + response_length - prompt_len)
    if max_model_len:
        max_tokens = min(max_tokens, max_model_len - prompt_len)
    want_logprobs = bool(p.pop("logprobs", False))
    n = p.pop("n", 1)
    if n != 1:
        raise ValueError(f"rollout_service: verl asks one completion per call, not n={n}")
    out: dict[str, Any] = {"max_tokens": max(1, int(max_tokens))}
    out["repetition_penalty"] = p.pop(
        "repetition_penalty", getattr(config, "repetition_penalty", None) or 1.0
    )
    out["ignore_eos"] = bool(p.pop("ignore_eos", getattr(config, "ignore_eos", False)))
    if seed is not None:
        p.setdefault("seed", seed)
    for key in _SAME:
        if key in p and p[key] is not None:
            out[key] = p.pop(key)
    for key in _IGNORED:
        p.pop(key, None)
    if p:
        raise TypeError(f"rollout_service: unsupported sampling parameter(s): {sorted(p)}")
    if "stop" in out:
        out["stop"] = [out["stop"]] if isinstance(out["stop"], str) else list(out["stop"])
    if want_logprobs:
        out["logprobs"] = 0  # the sampled token's own logprob is always returned
    return out, want_logprobs


class ServiceServer:
    """One replica's server (a Ray actor: ServiceReplica wraps it with
    ray.remote). What verl calls on it and what each does here:

    - `generate`: one Generate, pinned to the version set last;
    - `set_version` / `set_global_steps`: the version to pin to (the rollout
      adapter calls set_version after its push is acknowledged);
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
        self._clients: list[AsyncRolloutClient] | None = None
        self._next = itertools.count()
        self._max_model_len = 0
        self._running: dict[str, AsyncRolloutClient] = {}  # request id -> its service
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

    async def set_version(self, version: str, step: int | None) -> None:
        self.version, self.step = version, step

    async def set_global_steps(self, global_steps: int) -> None:
        """verl's name for it: the version f"{prefix}{global_steps}" when the
        prefix is configured; otherwise only the step that is reported."""
        prefix = self.settings.version_prefix
        if prefix is not None:
            self.version = f"{prefix}{global_steps}"
        self.step = global_steps

    async def get_version(self) -> tuple[str | None, int | None]:
        return self.version, self.step

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
        replica = extras.require("verl.workers.rollout.replica", "rollout_client.verl", "verl")
        if image_data or video_data or audio_data:
            raise NotImplementedError("rollout_service: multimodal prompts are not passed on yet")
        if not self._open.is_set():
            if self._rejecting:
                return replica.TokenOutput(
                    token_ids=[], stop_reason="aborted", extra_fields={"global_steps": self.step}
                )
            await self._open.wait()
        services = await self._services()
        ids = [int(t) for t in prompt_ids]
        kw, want_logprobs = sampling_kwargs(
            sampling_params, len(ids), self.config, self._max_model_len, self.seed
        )
        service = services[next(self._next) % len(services)]
        self._running[request_id] = service
        self._idle.clear()
        try:
            r = await service.generate(
                prompt_token_ids=ids,
                request_id=request_id,
                required_weight_version=self.version or "",
                **kw,
            )
        except RolloutError as e:
            # RolloutError does not cross Ray (it does not pickle): its reason
            # (WRONG_WEIGHT_VERSION when the served weights are not the
            # pushed ones) leads the message.
            raise RuntimeError(f"rollout_service: {e.reason}: {e}") from None
        finally:
            del self._running[request_id]
            if not self._running:
                self._idle.set()
        c = r.completions[0]
        step = (
            self.step if self.version else step_of(r.weight_version, self.settings.version_prefix)
        )
        return replica.TokenOutput(
            token_ids=list(c.token_ids),
            log_probs=list(c.logprobs) if want_logprobs else None,
            stop_reason=_STOP_REASONS.get(c.finish_reason),
            extra_fields={
                "global_steps": step,
                "weight_version": r.weight_version,
                "num_cached_tokens": r.usage.cached_prompt_tokens,
            },
        )

    async def clear_kv_cache(self) -> None:
        await asyncio.gather(*(c.reset_caches() for c in await self._services()))

    async def abort_all_requests(
        self, reset_prefix_cache: bool = True, reject_request: bool = False
    ) -> dict[str, Any]:
        self._open.clear()
        self._rejecting = reject_request
        running = dict(self._running)
        by_service: dict[int, list[str]] = {}
        for rid, service in running.items():
            by_service.setdefault(id(service), []).append(rid)
        services = {id(c): c for c in await self._services()}
        await asyncio.gather(*(services[k].abort(v) for k, v in by_service.items()))
        return {"aborted_count": len(running), "request_ids": list(running)}

    async def abort_request(
        self, request_id: str, reset_prefix_cache: bool = True
    ) -> dict[str, Any]:
        service = self._running.get(request_id)
        if service is None:
            return {"aborted": False, "request_id": request_id, "error": "not running"}
        await service.abort([request_id])
        return {"aborted": True, "request_id": request_id}

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
