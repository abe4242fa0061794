"""verl's checkpoint engine on the rollout service: the backend
`actor_rollout_ref.rollout.checkpoint_engine.backend=rollout_service`, for
the trainers that sync through verl's CheckpointEngineManager with a backend
other than "naive" (the separate-async trainer asserts one; the fully-async
trainer takes one).

What the manager does each sync (verl/checkpoint_engine/base.py) and what
happens here:

1. `abort_replicas`: every ServiceServer closes its gate and aborts its
   running calls at the service (they return their tokens, "aborted";
   verl's FullyAsyncLLMServerClient resumes them, and the resumed calls
   wait at the gate);
2. a worker group of the replicas' `workers`: a ServiceReplica's worker is
   its ServiceServer, whose `execute_checkpoint_engine` and
   `update_weights` run this class on the rollout side;
3. `prepare`, `build_topology`, `init_process_group`: nothing to set up
   (the service is reached over gRPC, not a process group);
4. `send_weights` on every trainer rank: handoff.Pusher streams the
   weights to the service from the master rank, full or delta as
   `rollout.custom` says, and moves every server's pin to the version after
   the acknowledgement; `receive_weights` on the rollout side yields
   nothing (the service loads the weights itself);
5. `finalize`: nothing; `resume_generation_replicas`: the gates open and the
   resumed calls run pinned to the new version.

Settings: `checkpoint_engine.engine_kwargs.rollout_service` takes the keys
of `rollout.custom`; without it (the usual case) the master rank reads
`rollout.custom` from the job's ServiceServers, which verl built from it.
"""

from __future__ import annotations

import time
from typing import Any

from rollout_client.verl.handoff import Pusher, drain, policy_servers
from rollout_client.verl.settings import NAME, Settings
from rollout_codecs import extras

_base = extras.require("verl.checkpoint_engine.base", "rollout_client.verl", extra="verl")
_CheckpointEngine: Any = _base.CheckpointEngine


class ServiceCheckpointEngine(_CheckpointEngine):  # type: ignore[misc]
    """`checkpoint_engine.backend=rollout_service` (see the module
    docstring). `pusher` (the master rank's, after its first sync) keeps the
    acknowledgements and the version pushed last."""

    wire_format = "named_tensors"

    def __init__(self, bucket_size: int = 0, is_master: bool = False, **custom: Any) -> None:
        self.bucket_size = bucket_size  # unused: the client chunks the stream itself
        self.is_master = is_master
        self._custom = custom
        self.pusher: Pusher | None = None

    async def _pusher(self) -> Pusher:
        if self.pusher is None:
            if self._custom:
                settings = Settings.from_custom(self._custom)
            else:
                servers = policy_servers()
                if not servers:
                    raise RuntimeError(
                        f"checkpoint_engine.backend={NAME} found no {NAME} rollout server in "
                        f"this Ray job: set actor_rollout_ref.rollout.name={NAME}, or name the "
                        f"service in checkpoint_engine.engine_kwargs.{NAME} (rollout.custom's keys)"
                    )
                settings = await servers[0].get_settings.remote()
            self.pusher = Pusher(settings)
        return self.pusher

    # -- the topology: none ------------------------------------------------

    def prepare(self) -> dict[str, Any]:
        return {}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict[str, Any]]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        return {}, {}

    def init_process_group(self, **kwargs: Any) -> None:
        pass

    def finalize(self) -> None:
        pass

    # -- the transfer ------------------------------------------------------

    async def send_weights(self, weights: Any, global_steps: int | None = None) -> dict[str, Any]:
        """Every trainer rank: iterate; the master rank pushes. Returns the
        sync's metrics, which verl's manager merges and logs."""
        started = time.monotonic()
        if not self.is_master:
            await drain(weights)
            return {}
        pusher = await self._pusher()
        ack = await pusher.hand_over(weights, global_steps)
        acks = getattr(ack, "acks", None) or {"": ack}  # a FleetAck: one per target
        return {
            f"{NAME}/push_seconds": time.monotonic() - started,
            f"{NAME}/bytes_sent": sum(a.bytes_received for a in acks.values()),
            f"{NAME}/requests_aborted": sum(a.requests_aborted for a in acks.values()),
        }

    async def receive_weights(self, global_steps: int | None = None) -> Any:
        """The rollout side: nothing arrives here (the service loads the
        weights; the master rank moves this replica's pin)."""
        return
        yield


def register() -> None:
    """verl's CheckpointEngineRegistry.register is a decorator factory."""
    _base.CheckpointEngineRegistry.register(NAME)(ServiceCheckpointEngine)
