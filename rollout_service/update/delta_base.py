"""The delta base: the served version's checkpoint-format bytes, which a delta
update (UpdateWeightsBegin.base_version) is decoded against.

They live in the staging region, which the server holds at the model's size
for full updates anyway: the region is laid out as the whole model, every
manifest tensor at a fixed offset (its slot), so each full update writes its
tensors where the last one left the others and the region always holds the
served bytes. At start the slots are filled from the checkpoint. No memory is
added for deltas beyond the encoded bytes themselves (the incoming region).

A delta is decoded in place (`materialize`): each tensor's sparse XOR (of
words or bytes) is applied to its slot and the slot's CRC-32C checked
against the declared one; raw tensors of a delta are copied in from the
incoming region after their old bytes are saved. `undo` reverses it (a
sparse XOR is its own inverse), so a delta that is refused or fails in the
engine leaves the base as it was.

The base is offered (GetServerInfo.delta_base_version) only while every slot
holds the served version's bytes. A full update that writes slots and then
does not apply (refused, aborted, failed) leaves those slots stale until an
update that sends those tensors succeeds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from rollout.v1 import rollout_pb2 as pb
from rollout_client import delta, dtypes
from rollout_service.errors import InvalidArgument
from rollout_service.staging import ALIGN, StagingRegion

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeltaTensor:
    """One tensor of a delta update: where its bytes came in and where it goes."""

    index: int  # in begin.tensors
    name: str
    encoding: int
    # In the incoming region: the bytes as they travelled.
    wire_offset: int
    wire_nbytes: int
    # In the staging region: the tensor's slot.
    slot_offset: int
    nbytes: int
    crc32c: int


@dataclass
class DeltaPlan:
    """A validated delta update's tensors, and what `materialize` did to the
    base (for `undo`)."""

    base_version: str
    tensors: list[DeltaTensor]
    # The encoded tensors that were applied (by index); the old bytes of
    # each raw tensor that was copied in.
    _applied: set[int] = field(default_factory=set)
    _saved: dict[int, bytes] = field(default_factory=dict)


def slot_layout(manifest: dict[str, pb.TensorSpec]) -> tuple[dict[str, int], int]:
    """Each tensor's slot offset (manifest order, aligned as the assembler
    aligns) and the bytes of the whole layout (reservation.region_bytes)."""
    offsets, at = {}, 0
    for name, spec in manifest.items():
        offsets[name] = at
        at += -(-dtypes.nbytes(spec.dtype, spec.shape) // ALIGN) * ALIGN
    return offsets, at


class DeltaBase:
    """Which version the staging region's slots hold, and applying deltas to it."""

    def __init__(
        self, manifest: dict[str, pb.TensorSpec], staging: StagingRegion, incoming: StagingRegion
    ) -> None:
        self.offsets, self.nbytes = slot_layout(manifest)
        self.staging = staging
        self.incoming = incoming
        # The slot layout needs the whole model in the region
        # (--max-update-bytes below it keeps the packed layout, no deltas).
        self.enabled = bool(manifest) and staging.size >= self.nbytes
        # The version every clean slot holds, and the slots that hold other bytes.
        self.version = ""
        self.stale: set[str] = set(self.offsets)

    def offered(self, served: str, degraded: bool) -> tuple[str, str]:
        """GetServerInfo.delta_base_version, and why it is empty when it is."""
        if not self.enabled:
            return (
                "",
                "this server keeps no delta base: --max-update-bytes is below the model's size",
            )
        if degraded or not served:
            return "", "the server is degraded and keeps no base until a full update succeeds"
        if self.stale or self.version != served:
            return "", (
                "part of its copy of the served weights is stale after an update that did not "
                "apply, until a full update sends those tensors"
            )
        return self.version, ""

    def load_checkpoint(self, model_dir: str, version: str) -> None:
        """Fills the slots from the checkpoint the engine started from (run
        in a thread at start, before serving)."""
        from rollout_client.sources import open_source

        if not self.enabled:
            return
        view = self.staging.ensure(0)
        for t in open_source(model_dir):
            at = self.offsets.get(t.name)
            if at is None or t.nbytes == 0:
                continue
            t.read_into(0, view[at : at + t.nbytes])
            t.release()
        self.installed(version, set(self.offsets))
        log.info("delta base: %s from the checkpoint (%d bytes)", version, self.nbytes)

    def writing(self, names: set[str]) -> None:
        """A full update is about to write these slots."""
        self.stale |= names

    def installed(self, version: str, names: set[str]) -> None:
        """An update succeeded: the slots of `names` hold `version`'s bytes,
        and so does every slot that was clean."""
        self.stale -= names
        self.version = version

    def materialize(self, plan: DeltaPlan) -> None:
        """Applies a validated delta to the slots (in a thread), tensor by
        tensor: each is decoded, checked, applied and its CRC-32C compared
        with the declared one. A tensor that does not decode, or whose
        reconstruction has another CRC-32C, undoes every tensor before it
        and is refused (INVALID_ARGUMENT). One decoded tensor is held at a
        time: a zstd frame is decompressed again to undo it, so that small
        frames of large contents cannot make the server hold more than one."""
        view = self.staging.ensure(0)
        wire = self.incoming.ensure(0)
        try:
            for t in plan.tensors:
                slot = view[t.slot_offset : t.slot_offset + t.nbytes]
                if delta.is_raw(t.encoding):
                    plan._saved[t.index] = bytes(slot)
                    slot[:] = wire[t.wire_offset : t.wire_offset + t.wire_nbytes]
                    continue
                payload = self._decoded(t)
                plan._applied.add(t.index)
                got = delta.apply_sparse_crc(slot, payload, t.encoding)
                if got != t.crc32c:
                    raise InvalidArgument(
                        f"begin.tensors[{t.index}].crc32c",
                        f"{t.name}: the delta against {plan.base_version!r} reconstructs "
                        f"bytes with CRC-32C {got:#010x}, not the declared "
                        f"{t.crc32c:#010x}; the update is refused and the base is untouched",
                    )
        except BaseException:
            self.undo(plan)
            raise

    def _decoded(self, t: DeltaTensor) -> memoryview | bytes:
        """The checked SPARSE_XOR16 bytes of an encoded tensor."""
        wire = self.incoming.ensure(0)
        payload: memoryview | bytes = wire[t.wire_offset : t.wire_offset + t.wire_nbytes]
        try:
            if t.encoding == delta.SPARSE_ZSTD:
                payload = delta.zstd_decompress(payload, t.nbytes)
            delta.check_sparse(payload, t.nbytes // delta.element(t.encoding).itemsize, t.encoding)
        except delta.DeltaError as e:
            raise InvalidArgument(
                f"begin.tensors[{t.index}].encoding", f"{t.name}: {e}; the base is untouched"
            ) from None
        return payload

    def undo(self, plan: DeltaPlan) -> None:
        """Puts back the base bytes that `materialize` changed (in a thread)."""
        view = self.staging.ensure(0)
        for t in plan.tensors:
            slot = view[t.slot_offset : t.slot_offset + t.nbytes]
            if t.index in plan._applied:
                delta.apply_sparse(delta.elements(slot, t.encoding), self._decoded(t))
            elif (old := plan._saved.pop(t.index, None)) is not None:
                slot[:] = old
        plan._applied.clear()
