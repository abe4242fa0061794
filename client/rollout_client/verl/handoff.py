"""One weight hand-off from verl's trainer ranks to the service, shared by
both ways verl hands weights over: the naive path (adapter.ServiceRollout.
update_weights) and the checkpoint-engine backend (checkpoint_engine.
ServiceCheckpointEngine.send_weights).

Every rank iterates verl's per-tensor generator (FSDP's full_tensor() in it
is a collective, so every rank must take part); the leader casts each
tensor to the dtype the service serves and pushes them in one update
(client `update_weights`, or a Fleet update for several targets) under the
version f"{prefix}{global_steps}", in the pause mode and as full or delta as
`rollout.custom` says. Around the push the leader tells every policy
ServiceServer of the Ray job: `begin_push` before (calls the service
refuses meanwhile wait for the new pin instead of failing), `set_version`
after the acknowledgement (the pin), `end_push` if it failed.
"""

from __future__ import annotations

import asyncio
import logging
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


class Pusher:
    """The leader's side of a hand-off: its connections, the served dtypes,
    the version prefix, and every acknowledgement (`acks`). The default
    prefix is "verl-", a run id made here, then "-step-": a version must be
    unique for the server's lifetime."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        prefix = settings.version_prefix
        self.version_prefix = prefix if prefix is not None else f"verl-{uuid.uuid4().hex[:8]}-step-"
        self.version: str | None = None  # pushed last
        self.acks: list[pb.UpdateWeightsResponse | FleetAck] = []
        self._client: RolloutClient | None = None
        self._fleet: Fleet | None = None
        self._served: dict[str, Any] | None = None  # the manifest: name -> dtype

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

    async def hand_over(self, weights: Any, global_steps: int | None) -> Any:
        """The leader's part: iterates `weights`, pushes them and moves
        every server's pin. Returns the acknowledgement."""
        await asyncio.to_thread(self._connect)
        tensors = [self._cast(name, t) async for name, t in _items(weights)]
        step = global_steps
        version = f"{self.version_prefix}{step if step is not None else uuid.uuid4().hex}"
        await tell_servers("begin_push", version)
        try:
            ack = await asyncio.to_thread(self._push, tensors, version)
        except BaseException:
            await tell_servers("end_push")
            raise
        del tensors
        self.acks.append(ack)
        self.version = version
        await tell_servers("set_version", version, step)
        log.info("rollout_service: pushed %s", version)
        return ack


async def drain(weights: Any) -> None:
    """Every other rank's part: iterate (the collectives in the generator)
    and drop the tensors."""
    async for _ in _items(weights):
        pass


async def _items(weights: Any) -> Any:
    if hasattr(weights, "__aiter__"):
        async for item in weights:
            yield item
    else:
        for item in weights:
            yield item


def policy_servers() -> list[Any]:
    """The ServiceServer actors of this Ray job that serve the policy
    (named f"{SERVER_PREFIX}{rank}..."; a reward or teacher model's replicas,
    "..._reward_0" or "..._teacher_0", serve other weights)."""
    ray = extras.require("ray", "rollout_client.verl", extra="verl")
    if not ray.is_initialized():
        return []
    names = sorted(str(n) for n in ray.util.list_named_actors())
    return [
        ray.get_actor(n)
        for n in names
        if n.removeprefix(SERVER_PREFIX)[:1].isdigit() and n.startswith(SERVER_PREFIX)
    ]


async def tell_servers(method: str, *args: Any) -> None:
    """Calls `method` on every policy ServiceServer of this Ray job."""
    await asyncio.gather(*(getattr(s, method).remote(*args) for s in policy_servers()))
