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
torch.distributed group, no rank returns before then (a barrier). The
hand-off itself (handoff.py) is the checkpoint-engine backend's too.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from rollout_client.verl.handoff import Pusher, drain
from rollout_client.verl.settings import Settings
from rollout_codecs import extras

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
        self.pusher = Pusher(self.settings)
        self.version_prefix = self.pusher.version_prefix
        self.acks = self.pusher.acks

    @property
    def version(self) -> str | None:
        """The version pushed last."""
        return self.pusher.version

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
            await self.pusher.hand_over(weights, global_steps)
        else:
            await drain(weights)
        await _barrier()

    async def resume(self, tags: list[str]) -> None:
        """No-op: the service keeps its weights and KV cache in its own memory."""

    async def release(self) -> None:
        """No-op (see resume)."""


async def _barrier() -> None:
    """verl's naive path returns from each rank on its own: no rank leaves
    before the leader's pin moved."""
    torch = extras.require("torch", "rollout_client.verl", extra="verl")
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        await asyncio.to_thread(dist.barrier)
