"""The second value of an update: every byte received and checked.

A ReceivedUpdate is what the receiver (upload.py) returns once the plan's
bytes all lie in the region with their checksums matching; the appliers
(base_weights.py, lora.py) take it. For a delta it also says what to decode
into which slot (delta_base.DeltaPlan) and which tensors the engine then
loads: every tensor sent, and the rest of each of their parameter groups
from the base (a fused module loads whole).
"""

from __future__ import annotations

from dataclasses import dataclass

import crc32c

from rollout.v1 import rollout_pb2 as pb
from rollout_codecs import delta, dtypes
from rollout_service.handoff.region import StagingRegion
from rollout_service.handoff.staged_tensor import StagedTensor
from rollout_service.update.delta_base import DeltaPlan, DeltaTensor
from rollout_service.update.plan import UpdatePlan


@dataclass(frozen=True)
class ReceivedUpdate:
    """A complete, validated update lying in the staging region."""

    plan: UpdatePlan
    # What the engine loads, from `region`.
    tensors: list[StagedTensor]
    region: StagingRegion
    bytes_received: int
    # A delta to decode into the slots first (None: not a delta, or a
    # possible retry, which is compared and never decoded).
    delta: DeltaPlan | None = None

    @property
    def begin(self) -> pb.UpdateWeightsBegin:
        return self.plan.begin

    @property
    def weight_version(self) -> str:
        return self.plan.begin.weight_version

    @property
    def base_version(self) -> str:
        return self.plan.begin.base_version

    @property
    def pause_mode(self) -> int:
        return self.plan.begin.pause_mode

    @property
    def drain_timeout_seconds(self) -> float:
        """Seconds the client allows for draining in-flight calls (0: the server's)."""
        return self.plan.begin.drain_timeout_seconds

    @property
    def names(self) -> set[str]:
        return {t.name for t in self.tensors}

    def content(self) -> tuple:
        """What identifies this update's bytes: every tensor's name, dtype,
        shape and CRC-32C (computed here where the client declared none; a
        delta declares every one). A retry of an applied update is
        recognised by it."""
        planned = self.plan.tensors
        if self.base_version:
            return (
                self.base_version,
                *(
                    (
                        t.spec.name,
                        t.spec.dtype,
                        tuple(t.spec.shape),
                        t.spec.encoding or delta.RAW,
                        t.spec.crc32c,
                    )
                    for t in planned
                ),
            )
        declared = {t.spec.name: t.spec.crc32c for t in planned if t.spec.HasField("crc32c")}
        buf = self.region.ensure(0)
        return tuple(
            (
                t.name,
                t.dtype,
                t.shape,
                declared[t.name]
                if t.name in declared
                else crc32c.crc32c(buf[t.offset : t.offset + t.nbytes]),
            )
            for t in self.tensors
        )


def received(plan: UpdatePlan, bytes_received: int) -> ReceivedUpdate:
    """The update `plan` describes, its bytes all in (upload.py checked them)."""
    if plan.begin.base_version:
        return _received_delta(plan, bytes_received)
    return ReceivedUpdate(
        plan=plan,
        tensors=[
            StagedTensor(
                name=t.spec.name,
                dtype=dtypes.torch_name(t.spec.dtype),
                shape=tuple(t.spec.shape),
                offset=t.offset,
                nbytes=t.nbytes,
            )
            for t in plan.tensors
        ],
        region=plan.region,
        bytes_received=bytes_received,
    )


def _received_delta(plan: UpdatePlan, bytes_received: int) -> ReceivedUpdate:
    """A complete delta: what to decode into which slot, and what the
    engine then loads (loaded from the staging region, where it is decoded)."""
    staging = plan.placement.staging
    if plan.retry:
        # A possible retry is compared by what it declares, never loaded.
        return ReceivedUpdate(plan=plan, tensors=[], region=staging, bytes_received=bytes_received)
    slots = plan.placement.slots or {}
    load = set(plan.names)
    for name in plan.names:
        load.update(plan.target.groups.get(name, ()))
    decode = DeltaPlan(
        base_version=plan.begin.base_version,
        tensors=[
            DeltaTensor(
                index=i,
                name=t.spec.name,
                encoding=t.spec.encoding,
                wire_offset=t.offset,
                wire_nbytes=t.wire_nbytes,
                slot_offset=slots[t.spec.name],
                nbytes=t.nbytes,
                crc32c=t.spec.crc32c,
            )
            for i, t in enumerate(plan.tensors)
        ],
    )
    return ReceivedUpdate(
        plan=plan,
        tensors=[
            StagedTensor(
                name=name,
                dtype=dtypes.torch_name(spec.dtype),
                shape=tuple(spec.shape),
                offset=slots[name],
                nbytes=dtypes.nbytes(spec.dtype, spec.shape),
            )
            for name, spec in plan.target.manifest.items()
            if name in load
        ],
        region=staging,
        bytes_received=bytes_received,
        delta=decode,
    )
