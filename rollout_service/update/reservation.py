"""How big the staging region must be, and reserving it before the engine.

The region holds the largest update the server can accept. An update names
each manifest tensor at most once, with the manifest's dtype and shape, each
tensor starting on the assembler's alignment (assembler.py): so no update is
larger than the whole model laid out that way. Reserving more (the default
max_update_bytes is the model plus 25% and 64 MiB) would pin memory that is
never written, and the reservation commits memory (staging.py).
--max-update-bytes below the model's size bounds it further.

When the checkpoint is a local directory its safetensors headers give the
sizes before the engine starts, so a /dev/shm too small fails in about a
second instead of after the engine's start-up; a model the engine fetches
itself is sized once it is up.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from rollout.v1 import rollout_pb2 as pb
from rollout_client import dtypes
from rollout_service.engine.startup import read_manifest
from rollout_service.staging import StagingRegion
from rollout_service.update.assembler import ALIGN


def region_bytes(manifest: Mapping[str, pb.TensorSpec], max_update_bytes: int | None) -> int:
    """The staging capacity for `manifest`: its full update, or the limit if
    that is smaller."""
    full = sum(-(-dtypes.nbytes(s.dtype, s.shape) // ALIGN) * ALIGN for s in manifest.values())
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
