"""How big the staging region must be, and reserving it before the engine.

The region holds the whole model laid out in slots (delta_base.py): every
full update writes there, and it is the base deltas are decoded against. An
update names each manifest tensor at most once, with the manifest's dtype and
shape, so none is larger than that layout. Reserving more (the default
max_update_bytes is the model plus 25% and 64 MiB) would pin memory that is
never written, and the reservation commits memory (handoff/region.py).
--max-update-bytes below the model's size bounds it further (updates are then
packed, and no delta is accepted).

When the checkpoint is a local directory its safetensors headers give the
sizes before the engine starts, so a /dev/shm too small fails in about a
second instead of after the engine's start-up; a model the engine fetches
itself is sized once it is up.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from rollout.v1 import rollout_pb2 as pb
from rollout_service.engine.startup import read_manifest
from rollout_service.handoff.region import StagingRegion
from rollout_service.update.delta_base import slot_layout


def region_bytes(manifest: Mapping[str, pb.TensorSpec], max_update_bytes: int | None) -> int:
    """The staging capacity for `manifest`: its full update, or the limit if
    that is smaller."""
    _, full = slot_layout(dict(manifest))
    return full if max_update_bytes is None else min(full, max_update_bytes)


def reserve_for_checkpoint(
    region: StagingRegion, model: str, max_update_bytes: int | None
) -> int | None:
    """Reserves `region` for the checkpoint in directory `model`; returns the
    bytes reserved, or None when `model` is not a local directory. Raises
    staging.StagingSpaceError when /dev/shm cannot hold it."""
    if not os.path.isdir(model):
        return None
    nbytes = region_bytes(read_manifest(model), max_update_bytes)
    if nbytes:
        region.ensure(nbytes)
    return nbytes
