"""The delta base: the served version's checkpoint-format bytes, which a delta
update (UpdateWeightsBegin.base_version) is decoded against.

They live in the staging region, which the server holds at the model's size
for full updates anyway: the region is laid out as the whole model, every
manifest tensor at a fixed offset (its slot), so each full update writes its
tensors where the last one left the others and the region always holds the
served bytes. At start the slots are filled from the checkpoint. No memory is
added for deltas beyond the encoded bytes themselves (the incoming region).

A delta is decoded in place (`decode`, a group of tensors at a time, while
the engine loads the group before: delta_load.py): each tensor's sparse XOR
(of words or bytes) is applied to its slot and the slot's CRC-32C checked
against the declared one; raw tensors of a delta are copied in from the
incoming region after their old bytes are saved. `undo` reverses it (a
sparse XOR is its own inverse), so a delta that is refused or fails in the
engine leaves the base as it was. `check` refuses entries that do not
decode before anything is written.

The decode is memory-bound (it touches every cache line of the model, then
takes the CRC-32C of each reconstructed tensor), so tensors are decoded
`decode_threads` at a time. While the engine is idle (the first group) they
run on `decode_cpus`: every CPU the process was given, including on a CPU
host the cores vLLM binds its worker to (placement.py keeps the server's
threads off them; a decode thread goes back to the server's own cores after
each tensor); while it loads, on the server's own cores only.
`--delta-decode-threads 1` keeps the whole decode on the server's own core.

The base is offered (GetServerInfo.delta_base_version) only while every slot
holds the served version's bytes. A full update that writes slots and then
does not apply (refused, aborted, failed) leaves those slots stale until an
update that sends those tensors succeeds: a slot from the first byte written
into it (upload.py), so that an update aborted before any byte came in
costs the base nothing; a same-host update's slots from its begin, since
its client writes into the region unseen.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from rollout.v1 import rollout_pb2 as pb
from rollout_codecs import delta, dtypes
from rollout_service.handoff.region import ALIGN, StagingRegion
from rollout_service.status.errors import InvalidArgument

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
    """A validated delta update's tensors, and what `decode` did to the
    base (for `undo`)."""

    base_version: str
    tensors: list[DeltaTensor]
    # The encoded tensors that were applied (by index); the old bytes of
    # each raw tensor that was copied in.
    _applied: set[int] = field(default_factory=set)
    _saved: dict[int, bytes] = field(default_factory=dict)
    # `check` found every entry of its sparse tensors in bounds.
    _checked: bool = False


def slot_layout(manifest: dict[str, pb.TensorSpec]) -> tuple[dict[str, int], int]:
    """Each tensor's slot offset (manifest order, aligned as plan.py
    aligns) and the bytes of the whole layout (reservation.region_bytes)."""
    offsets, at = {}, 0
    for name, spec in manifest.items():
        offsets[name] = at
        at += -(-dtypes.nbytes(spec.dtype, spec.shape) // ALIGN) * ALIGN
    return offsets, at


class DeltaBase:
    """Which version the staging region's slots hold, and applying deltas to it."""

    def __init__(
        self,
        manifest: dict[str, pb.TensorSpec],
        staging: StagingRegion,
        incoming: StagingRegion,
        decode_threads: int = 1,
        decode_cpus: set[int] | None = None,
    ) -> None:
        self.offsets, self.nbytes = slot_layout(manifest)
        self.staging = staging
        self.incoming = incoming
        self.decode_threads = max(1, decode_threads)
        self.decode_cpus = decode_cpus
        self._pool: ThreadPoolExecutor | None = None
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
        from rollout_codecs.sources import open_source

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
        """A full update writes into these slots now (its first bytes)."""
        self.stale |= names

    def installed(self, version: str, names: set[str]) -> None:
        """An update succeeded: the slots of `names` hold `version`'s bytes,
        and so does every slot that was clean."""
        self.stale -= names
        self.version = version

    def check(self, plan: DeltaPlan) -> None:
        """Refuses (INVALID_ARGUMENT, the lowest such tensor) a delta with a
        tensor whose entries do not decode, before anything is written or
        the engine touched (called in a thread). A zstd frame is only
        decompressed later, in `decode`."""
        for t in plan.tensors:
            if not delta.is_raw(t.encoding) and t.encoding != delta.SPARSE_ZSTD:
                self._decoded(t)
        plan._checked = True

    def decode(self, plan: DeltaPlan, tensors: list[DeltaTensor], borrow: bool = True) -> None:
        """Applies `tensors` of a checked delta to their slots (called in a
        thread): raw tensors are copied in, then the encoded ones are
        decoded, applied and their CRC-32C compared with the declared one,
        `decode_threads` at a time (on every CPU of `decode_cpus` if
        `borrow`: the engine is idle). If any tensor does not decode, or its
        reconstruction has another CRC-32C, the lowest such tensor is refused
        (INVALID_ARGUMENT) once all have ended; `undo(plan)` then puts back
        everything decoded so far. At most one decoded tensor per thread is
        held at a time: a zstd frame is decompressed again to undo it, so that
        small frames of large contents cannot make the server hold more."""
        view = self.staging.ensure(0)
        wire = self.incoming.ensure(0)
        lock = threading.Lock()

        def refusal(t: DeltaTensor) -> InvalidArgument | None:
            """Decodes and applies `t`; why it is refused, if it is."""
            try:
                # Nothing is written if it does not decode.
                payload = self._decoded(t, checked=plan._checked)
            except InvalidArgument as e:
                return e
            slot = view[t.slot_offset : t.slot_offset + t.nbytes]
            with lock:
                plan._applied.add(t.index)
            got = delta.apply_sparse_crc(slot, payload, t.encoding)
            if got == t.crc32c:
                return None
            return InvalidArgument(
                f"begin.tensors[{t.index}].crc32c",
                f"{t.name}: the delta against {plan.base_version!r} reconstructs "
                f"bytes with CRC-32C {got:#010x}, not the declared "
                f"{t.crc32c:#010x}; the update is refused and the base is untouched",
            )

        def borrowing(t: DeltaTensor) -> InvalidArgument | None:
            """`refusal` on every CPU of `decode_cpus`, then back on this
            thread's own (placement.py's)."""
            own = os.sched_getaffinity(0)
            if self.decode_cpus:
                os.sched_setaffinity(0, self.decode_cpus)
            try:
                return refusal(t)
            finally:
                os.sched_setaffinity(0, own)

        encoded = []
        for t in tensors:
            if not delta.is_raw(t.encoding):
                encoded.append(t)
                continue
            slot = view[t.slot_offset : t.slot_offset + t.nbytes]
            plan._saved[t.index] = bytes(slot)
            slot[:] = wire[t.wire_offset : t.wire_offset + t.wire_nbytes]
        if self.decode_threads == 1 or len(encoded) < 2:
            refusals = [refusal(t) for t in encoded]
        else:
            # Largest first, so that the threads end together; every
            # decode ends before anything is raised.
            encoded.sort(key=lambda t: t.nbytes, reverse=True)
            one = borrowing if borrow else refusal
            futures = [self._decoders().submit(one, t) for t in encoded]
            wait(futures)
            refusals = [f.result() for f in futures]
        refused = [(t.index, r) for t, r in zip(encoded, refusals) if r is not None]
        if refused:
            raise min(refused, key=lambda x: x[0])[1]

    def _decoders(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.decode_threads, thread_name_prefix="delta-decode")
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _decoded(self, t: DeltaTensor, checked: bool = False) -> memoryview | bytes:
        """The checked sparse bytes of an encoded tensor (`checked`: its
        entries were checked already, unless it is a zstd frame)."""
        wire = self.incoming.ensure(0)
        payload: memoryview | bytes = wire[t.wire_offset : t.wire_offset + t.wire_nbytes]
        try:
            if t.encoding == delta.SPARSE_ZSTD:
                payload = delta.zstd_decompress(payload, t.nbytes)
            elif checked:
                return payload
            delta.check_sparse(payload, t.nbytes // delta.element(t.encoding).itemsize, t.encoding)
        except delta.DeltaError as e:
            raise InvalidArgument(
                f"begin.tensors[{t.index}].encoding", f"{t.name}: {e}; the base is untouched"
            ) from None
        return payload

    def undo(self, plan: DeltaPlan) -> None:
        """Puts back the base bytes that `decode` changed (in a thread)."""
        view = self.staging.ensure(0)
        for t in plan.tensors:
            slot = view[t.slot_offset : t.slot_offset + t.nbytes]
            if t.index in plan._applied:
                payload = self._decoded(t, checked=plan._checked)
                delta.apply_sparse(delta.elements(slot, t.encoding), payload)
            elif (old := plan._saved.pop(t.index, None)) is not None:
                slot[:] = old
        plan._applied.clear()
