"""verl's RolloutReplica on the rollout service: it launches no engine, one
ServiceServer actor per replica instead, in every mode (hybrid, colocated,
standalone) and without GPUs of its own: the engine is the service's.
Outside hybrid mode the server is also the replica's one worker, the rollout
side of verl's CheckpointEngineManager (checkpoint_engine.py)."""

from __future__ import annotations

from typing import Any

from rollout_client.verl.server import ServiceServer
from rollout_client.verl.settings import SERVER_PREFIX, Settings
from rollout_codecs import extras

_replica = extras.require("verl.workers.rollout.replica", "rollout_client.verl", extra="verl")
_ray = extras.require("ray", "rollout_client.verl", extra="verl")
_RolloutReplica: Any = _replica.RolloutReplica


class ServiceReplica(_RolloutReplica):  # type: ignore[misc]
    """One verl rollout replica served by the service (or a fleet of them,
    `rollout.custom.target`). Its server's address is the targets and the
    replica's rank: distinct per replica, as verl's load balancer keys
    servers by address."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings = Settings.from_rollout_config(self.config)

    def _server_name(self) -> str:
        role = "reward_" if self.is_reward_model else "teacher_" if self.is_teacher_model else ""
        return f"{SERVER_PREFIX}{role}{self.replica_rank}{self.name_suffix}"

    async def init_colocated(self, resource_pool: Any) -> None:
        self.rollout_mode = _replica.RolloutMode.COLOCATED
        self.resource_pool = resource_pool
        await self.launch_servers()

    async def init_standalone(self) -> None:
        """No resource pool: the service runs elsewhere (verl's own
        init_standalone asks Ray for GPUs)."""
        self.rollout_mode = _replica.RolloutMode.STANDALONE
        await self.launch_servers()

    async def launch_servers(self) -> None:
        server_class = _ray.remote(ServiceServer)
        server = server_class.options(
            name=self._server_name(),
            max_concurrency=self.max_concurrency,
            num_cpus=0,
        ).remote(
            config=self.config,
            settings=self.settings,
            replica_rank=self.replica_rank,
            full_determinism=bool(getattr(self.config, "full_determinism", False)),
        )
        self.servers = [server]
        # Standalone, colocated: the server is the checkpoint engine's rollout side.
        if not getattr(self, "workers", None):
            self.workers = [server]
        self._server_handle = server
        self._server_address = await server.get_server_address.remote()
