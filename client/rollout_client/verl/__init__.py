"""verl (0.9.1) on the rollout service: a rollout backend that verl loads
from outside its tree, through its `verl.plugins` entry-point group (or
`VERL_USE_EXTERNAL_MODULES=rollout_client.verl`). Importing this package
fills verl's three registries under the name `rollout_service`:

- `RolloutReplicaRegistry` (how rollouts are served): `ServiceReplica`
  starts no engine; its server (a Ray actor, `ServiceServer`) answers verl's
  `generate(request_id, prompt_ids, sampling_params)` from a running service,
  pinned to the version pushed last;
- `_ROLLOUT_REGISTRY` (how each trainer rank hands its weights over):
  `ServiceRollout.update_weights` streams verl's per-tensor generator to the
  service from the leader rank under the version of verl's `global_steps`
  (the other ranks iterate it too: FSDP's full_tensor() is a collective);
- `CheckpointEngineRegistry` (how the async trainers' CheckpointEngineManager
  syncs): `ServiceCheckpointEngine` streams the same way from the master
  trainer rank; the replicas' servers are its rollout side.

The configuration is verl's own:

    actor_rollout_ref.rollout.name=rollout_service
    'actor_rollout_ref.rollout.custom={target:"10.0.0.5:50051"}'

Needs the `verl` extra (`pip install './client[verl]'` from a clone of the repository).
docs/verl.md has the details and limits.
"""

from __future__ import annotations

from rollout_client.verl.settings import ADAPTER, NAME
from rollout_codecs import extras


def _load_replica() -> type:
    from rollout_client.verl.replica import ServiceReplica

    return ServiceReplica


def register() -> None:
    """Fills verl's registries (idempotent; run on import)."""
    replica = extras.require("verl.workers.rollout.replica", "rollout_client.verl", extra="verl")
    base = extras.require("verl.workers.rollout.base", "rollout_client.verl", extra="verl")
    replica.RolloutReplicaRegistry.register(NAME, _load_replica)
    base._ROLLOUT_REGISTRY[(NAME, "async")] = ADAPTER
    from rollout_client.verl import checkpoint_engine

    checkpoint_engine.register()


register()
