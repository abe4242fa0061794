"""verl's BaseRollout on the rollout service: how each trainer rank hands
its weights over (`ActorRolloutRefWorker.update_weights`, the "naive"
checkpoint-engine path, calls `update_weights(per_tensor_param,
global_steps=...)` on every rank).

The leader rank (global rank 0) casts each tensor to the dtype the service
serves and pushes them in one update (client `update_weights`, or a Fleet
update for several targets) under the version f"{prefix}{global_steps}", in
the pause mode of `rollout.custom.pause_mode` (default abort: calls running
at the service end with their tokens and verl resumes them, instead of the
push waiting for the longest one);
every other rank iterates the generator too (FSDP's full_tensor() in it is a
collective) and drops the tensors. After the acknowledgement (which lists
the prefix, multimodal and encoder caches reset) the leader tells every
ServiceServer of the job to pin its calls to that version; with a
torch.distributed group, no rank returns before then (a barrier).
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_client.client import RolloutClient
from rollout_client.fleet import Fleet, FleetAck
from rollout_client.verl.settings import SERVER_PREFIX, Settings
from rollout_codecs import dtypes, extras

log = logging.getLogger(__name__)

# rollout.custom.pause_mode: what a push does to the calls running at the service.
_PAUSE_MODES = {
    "wait": pb.PAUSE_MODE_WAIT,
    "abort": pb.PAUSE_MODE_ABORT,
    "keep": pb.PAUSE_MODE_KEEP,
}

_base = extras.require("verl.workers.rollout.base", "rollout_client.verl", extra="verl")
_BaseRollout: Any = _base.BaseRollout


def _rank() -> int:
    torch = extras.require("torch", "rollout_client.verl", extra="verl")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_rank())
    return int(os.environ.get("RANK", "0"))


class ServiceRollout(_BaseRollout):  # type: ignore[misc]
    """`rollout.name=rollout_service`'s rollout: see the module docstring.
    `acks` keeps every acknowledgement of this rank's pushes (the leader's)."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, *args: Any, **kw: Any):
        super().__init__(config, model_config, device_mesh)
        self.settings = Settings.from_rollout_config(self.config)
        self.leader = _rank() == 0
        prefix = self.settings.version_prefix
        self.version_prefix = prefix if prefix is not None else f"verl-{uuid.uuid4().hex[:8]}-step-"
        self.version: str | None = None  # pushed last
        self.acks: list[pb.UpdateWeightsResponse | FleetAck] = []
        self._client: RolloutClient | None = None
        self._fleet: Fleet | None = None
        self._served: dict[str, Any] | None = None  # the manifest: name -> dtype

    # -- the service -------------------------------------------------------

    def _connect(self) -> RolloutClient:
        s = self.settings
        if self._client is None:
            self._client = RolloutClient(s.targets[0], timeout=s.timeout, **s.client_options())
            self._served = {p.name: p.dtype for p in self._client.server_info().parameters}
            if len(s.targets) > 1:
                self._fleet = Fleet(
                    list(s.targets),
                    timeout=s.timeout,
                    probe_seconds=None,
                    heal_from_source=False,
                    **s.client_options(),
                )
        return self._client

    def _push(self, tensors: list[tuple[str, Any]], version: str) -> Any:
        client = self._connect()
        s = self.settings
        mode = _PAUSE_MODES[s.pause_mode]
        if self._fleet is not None:
            return self._fleet.update_weights(
                tensors, version, timeout=s.timeout, delta=s.delta, pause_mode=mode
            )
        return client.update_weights(
            tensors, version, streams=s.streams, delta=s.delta, pause_mode=mode
        )

    def _cast(self, name: str, tensor: Any) -> tuple[str, Any]:
        torch = extras.require("torch", "rollout_client.verl", extra="verl")
        assert self._served is not None
        if name not in self._served:
            raise KeyError(f"{name!r} is not a parameter of the served model")
        dtype = getattr(torch, dtypes.torch_name(self._served[name]))
        if hasattr(tensor, "full_tensor"):  # a DTensor the generator did not gather
            tensor = tensor.full_tensor()
        return name, tensor.detach().to(device="cpu", dtype=dtype).contiguous()

    # -- BaseRollout -------------------------------------------------------

    async def update_weights(
        self,
        weights: Any,
        global_steps: int | None = None,
        wire_format: str = "named_tensors",
        peft_config: Any = None,
        **kwargs: Any,
    ) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(
                f"rollout_service takes wire_format='named_tensors', not {wire_format!r}"
            )
        if peft_config is not None:
            raise NotImplementedError(
                "rollout_service pushes full weights: set actor_rollout_ref.model.lora.merge=True"
            )
        if self.leader:
            await asyncio.to_thread(self._connect)
        tensors: list[tuple[str, Any]] = []
        async for name, tensor in _items(weights):  # every rank: the collectives in it
            if self.leader:
                tensors.append(self._cast(name, tensor))
        if self.leader:
            step = global_steps
            version = f"{self.version_prefix}{step if step is not None else uuid.uuid4().hex}"
            await _tell_servers("begin_push", version)
            try:
                ack = await asyncio.to_thread(self._push, tensors, version)
            except BaseException:
                await _tell_servers("end_push")
                raise
            del tensors
            self.acks.append(ack)
            self.version = version
            await _tell_servers("set_version", version, step)
            log.info("rollout_service: pushed %s", version)
        await _barrier()

    async def resume(self, tags: list[str]) -> None:
        """No-op: the service keeps its weights and KV cache in its own memory."""

    async def release(self) -> None:
        """No-op (see resume)."""


async def _items(weights: Any) -> Any:
    if hasattr(weights, "__aiter__"):
        async for item in weights:
            yield item
    else:
        for item in weights:
            yield item


async def _tell_servers(method: str, *args: Any) -> None:
    """Calls `method` on every ServiceServer of this Ray job: begin_push
    before a push (calls the service refuses meanwhile wait for the new pin
    instead of failing), set_version after its acknowledgement (the pin),
    end_push if it failed."""
    ray = extras.require("ray", "rollout_client.verl", extra="verl")
    if not ray.is_initialized():
        return
    names = [n for n in ray.util.list_named_actors() if str(n).startswith(SERVER_PREFIX)]
    await asyncio.gather(*(getattr(ray.get_actor(n), method).remote(*args) for n in names))


async def _barrier() -> None:
    torch = extras.require("torch", "rollout_client.verl", extra="verl")
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        await asyncio.to_thread(dist.barrier)
