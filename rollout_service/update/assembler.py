"""Assembling one UpdateWeights stream into the staging region.

Everything about the stream is validated here, before anything touches the
engine: the message order, tensor names/dtypes/shapes against the manifest,
that chunks lie inside their tensor and that every byte is written exactly
once, the checksums and the size limit. Pure Python over a memoryview: tested
without an engine.

Where the bytes go: a full update writes each tensor into its slot of the
staging region (delta_base.py: the region laid out as the whole model), or,
when the region is smaller than the model, packed in begin's order. A delta
update, and an update naming the served version (a possible retry, which
must not touch the served bytes), are packed into the incoming region
instead; a delta is decoded into the slots later (delta_base.materialize).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import crc32c

from rollout.v1 import rollout_pb2 as pb
from rollout_client import delta, dtypes
from rollout_client.wire import RawChunk
from rollout_service.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from rollout_service.handoff.region import ALIGN, StagingRegion, StagingSpaceError
from rollout_service.handoff.staged_tensor import StagedTensor
from rollout_service.update.delta_base import DeltaPlan, DeltaTensor


@dataclass(frozen=True)
class Placement:
    """Where the updater lets an update's bytes go."""

    staging: StagingRegion
    # name -> slot offset in `staging` (delta_base.slot_layout); None: the
    # region is smaller than the model, full updates are packed.
    slots: dict[str, int] | None = None
    # Deltas and possible retries; None: packed in `staging` (tests).
    incoming: StagingRegion | None = None
    # GetServerInfo.delta_base_version now, and why it is empty when it is.
    delta_base: str = ""
    no_base_why: str = "this server keeps no delta base"
    # Called with the names whose slots a full update is about to write.
    writing: Callable[[set[str]], None] = lambda names: None


# Chunks in one TensorChunkBatch (the proto says so).
MAX_BATCH_CHUNKS = 1024
# Separate byte ranges one tensor's received bytes may form: an in-order
# stream keeps one, parallel streams a few per stream; the bound keeps each
# insertion into the sorted lists cheap whatever order chunks come in.
MAX_RANGES = 1 << 16


@dataclass
class _Coverage:
    """Byte ranges of one tensor written so far: sorted, disjoint, merged."""

    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    received: int = 0

    def add(self, start: int, end: int) -> str:
        """Records [start, end); else says why not (an overlap with a
        recorded range, or one range more than MAX_RANGES)."""
        i = bisect.bisect_right(self.starts, start)
        if i > 0 and self.ends[i - 1] > start:
            return "overlap"
        if i < len(self.starts) and self.starts[i] < end:
            return "overlap"
        joins = (i > 0 and self.ends[i - 1] == start) or (
            i < len(self.starts) and self.starts[i] == end
        )
        if not joins and len(self.starts) >= MAX_RANGES:
            return "ranges"
        self.received += end - start
        # Merge with the neighbours it touches, to keep the lists short for
        # the usual in-order stream.
        if i > 0 and self.ends[i - 1] == start:
            self.ends[i - 1] = end
            if i < len(self.starts) and self.starts[i] == end:
                self.ends[i - 1] = self.ends.pop(i)
                self.starts.pop(i)
        elif i < len(self.starts) and self.starts[i] == end:
            self.starts[i] = start
        else:
            self.starts.insert(i, start)
            self.ends.insert(i, end)
        return ""


@dataclass
class _Staged:
    spec: pb.TensorSpec
    # Where its bytes go in the region, and how many travel (the encoded
    # bytes of an encoded tensor).
    offset: int
    nbytes: int
    wire_nbytes: int
    coverage: _Coverage = field(default_factory=_Coverage)


@dataclass(frozen=True)
class StagedUpdate:
    """A complete, validated update lying in the staging region."""

    weight_version: str
    pause_mode: int
    tensors: list[StagedTensor]
    bytes_received: int
    # CRC-32C of each tensor the client declared one for (checked).
    declared_crcs: dict[str, int]
    # Seconds the client allows for draining in-flight calls (0: the server's).
    drain_timeout_seconds: float = 0.0
    # Set when the update targets a LoRA adapter (lora.py), not the base.
    adapter: pb.AdapterTarget | None = None
    # The region `tensors` lie in.
    region: StagingRegion | None = None
    # A delta update: its base version, and (unless it names the served
    # version: a possible retry, never decoded) what to decode.
    base_version: str = ""
    delta: DeltaPlan | None = None
    # A delta's tensors as declared (name, dtype, shape, encoding, crc32c).
    declared: tuple = ()

    @property
    def names(self) -> set[str]:
        return {t.name for t in self.tensors}

    def content(self) -> tuple:
        """What identifies this update's bytes: every tensor's name, dtype,
        shape and CRC-32C (computed here where the client declared none; a
        delta declares every one). A retry of an applied update is
        recognised by it."""
        if self.base_version:
            return (self.base_version, *self.declared)
        assert self.region is not None
        buf = self.region.ensure(0)
        return tuple(
            (
                t.name,
                t.dtype,
                t.shape,
                self.declared_crcs.get(t.name)
                if t.name in self.declared_crcs
                else crc32c.crc32c(buf[t.offset : t.offset + t.nbytes]),
            )
            for t in self.tensors
        )


class UpdateAssembler:
    """Consumes the messages of one stream; `finish()` returns the update."""

    def __init__(
        self,
        manifest: dict[str, pb.TensorSpec],
        max_update_bytes: int,
        staging,
        current_version: str,
        groups: Mapping[str, Sequence[str]] | None = None,
        replayable_version: str | None = None,
        keep_refusal: str | None = None,
        allow_empty: bool = False,
        placement: Placement | None = None,
    ) -> None:
        # An adapter removal carries no tensors.
        self._allow_empty = allow_empty
        self._manifest = manifest
        # Why PAUSE_MODE_KEEP cannot be honoured on this server, if it cannot.
        self._keep_refusal = keep_refusal
        self._current_version = current_version
        # name -> every name of its group (param_groups.py); absent: alone.
        self._groups = groups or {}
        # The served version may be named again by a retry of the update that
        # installed it: the updater then compares contents (updates.py).
        self._replayable = replayable_version
        self._max_bytes = max_update_bytes
        self._place = placement or Placement(staging)
        self._staging = staging
        self._begin: pb.UpdateWeightsBegin | None = None
        self._tensors: list[_Staged] = []
        self._buf: memoryview | None = None
        self._end = 0  # the bytes of the region the update begun takes
        self._packed = False
        self._committed = False
        self.bytes_received = 0

    def feed(self, msg: pb.UpdateWeightsRequest | RawChunk) -> None:
        """Validates and applies one message of an UpdateWeights stream (a
        RawChunk: a chunk message parsed without protobuf, see wire.py)."""
        if isinstance(msg, RawChunk):
            if self._begin is None:
                raise InvalidArgument("chunk", "the first message must be begin")
            if self._committed:
                raise InvalidArgument("commit", "a chunk message came after commit")
            return self.add_chunk(msg.tensor_index, msg.offset, msg.data)
        kind = msg.WhichOneof("kind")
        if self._committed:
            raise InvalidArgument("commit", f"a {kind or 'empty'} message came after commit")
        if kind == "begin":
            if self._begin is not None:
                raise InvalidArgument("begin", "the stream has two begin messages")
            self._on_begin(msg.begin)
        elif self._begin is None:
            raise InvalidArgument(kind or "kind", "the first message must be begin")
        elif kind == "chunk":
            self.add_chunk(msg.chunk.tensor_index, msg.chunk.offset, msg.chunk.data)
        elif kind == "chunks":
            self.add_chunks(msg.chunks.chunks)
        elif kind == "commit":
            self._committed = True
        else:
            raise InvalidArgument("kind", "message sets none of begin, chunk, chunks, commit")

    def begin(self, begin: pb.UpdateWeightsBegin, reserve: bool = True) -> None:
        """Validates `begin`; `reserve=False`: the caller calls `reserve`
        after (UpdateSessions.begin, in a thread)."""
        if self._begin is not None:
            raise InvalidArgument("begin", "the update has two begin messages")
        self._on_begin(begin, reserve)

    def _on_begin(self, begin: pb.UpdateWeightsBegin, reserve: bool = True) -> None:
        if not begin.weight_version:
            raise InvalidArgument("begin.weight_version", "must not be empty")
        if begin.weight_version == self._current_version != self._replayable:
            raise FailedPrecondition(
                f"begin.weight_version: {begin.weight_version!r} is already the served version",
                reason=pb.ERROR_REASON_VERSION_ALREADY_SERVED,
            )
        if begin.HasField("drain_timeout_seconds") and not begin.drain_timeout_seconds > 0:
            raise InvalidArgument(
                "begin.drain_timeout_seconds", f"must be > 0, got {begin.drain_timeout_seconds}"
            )
        if not begin.tensors and not self._allow_empty:
            raise InvalidArgument("begin.tensors", "must name at least one tensor")
        if begin.pause_mode not in pb.PauseMode.values():
            raise InvalidArgument("begin.pause_mode", f"unknown value {begin.pause_mode}")
        if begin.pause_mode == pb.PAUSE_MODE_KEEP and self._keep_refusal:
            raise InvalidArgument("begin.pause_mode", self._keep_refusal)
        # Naming the served version: a possible retry of the update that
        # installed it (updates.py compares), never decoded or loaded.
        self._retry = begin.weight_version == self._current_version
        self._check_base(begin)
        seen: set[str] = set()
        offset = 0
        self._begin_tensors = begin.tensors
        packed = self._packed = bool(begin.base_version) or self._retry or self._place.slots is None
        self._region = (
            self._place.incoming
            if packed and self._place.incoming is not None and self._place.slots is not None
            else self._staging
        )
        for i, spec in enumerate(begin.tensors):
            where = f"begin.tensors[{i}]"
            expected = self._manifest.get(spec.name)
            if expected is None:
                raise InvalidArgument(
                    f"{where}.name", f"{spec.name!r} is not a parameter of the served model"
                )
            if spec.name in seen:
                raise InvalidArgument(f"{where}.name", f"{spec.name!r} is declared twice")
            seen.add(spec.name)
            if spec.dtype != expected.dtype:
                raise InvalidArgument(
                    f"{where}.dtype",
                    f"{spec.name}: got {dtypes.name(spec.dtype)}, "
                    f"the model takes {dtypes.name(expected.dtype)}",
                )
            if list(spec.shape) != list(expected.shape):
                raise InvalidArgument(
                    f"{where}.shape",
                    f"{spec.name}: got {list(spec.shape)}, the model takes {list(expected.shape)}",
                )
            nbytes = dtypes.nbytes(spec.dtype, spec.shape)
            wire = self._wire_bytes(where, spec, nbytes, bool(begin.base_version))
            at = offset if packed else self._place.slots[spec.name]  # type: ignore[index]
            self._tensors.append(_Staged(spec=spec, offset=at, nbytes=nbytes, wire_nbytes=wire))
            offset += -(-wire // ALIGN) * ALIGN
        if not begin.base_version:
            self._check_groups(seen)
        if offset > self._max_bytes:
            raise ResourceExhausted(
                f"begin.tensors: the update is {offset} bytes, over the limit of "
                f"{self._max_bytes} bytes (max_update_bytes)"
            )
        self._begin = begin
        self._end = max((t.offset + t.wire_nbytes for t in self._tensors), default=0)
        if reserve:
            self.reserve()
        if not packed:
            self._place.writing(seen)

    def reserve(self) -> None:
        """Makes the region hold the update begun (begin). Growing it (a
        delta larger than any before it) allocates and faults in its pages:
        in a thread (UpdateSessions.begin), time that grows with the update.
        The incoming region grows with a quarter to spare, so that the next
        steps' deltas, a little larger or smaller, fit without growing it
        again."""
        room = min(self._end // 4, max(self._max_bytes - self._end, 0)) if self._packed else 0
        grows = self._region.size < self._end
        try:
            self._buf = self._region.ensure(self._end, prefault=grows, room=room)
        except StagingSpaceError as e:
            raise ResourceExhausted(
                f"begin.tensors: the update's {self._end} bytes do not fit: {e}"
            ) from None

    def _check_base(self, begin: pb.UpdateWeightsBegin) -> None:
        """A delta's base: the server's, unless the update is a possible retry
        (the base has moved on to the version it installed)."""
        if not begin.base_version:
            return
        if begin.HasField("adapter"):
            raise InvalidArgument(
                "begin.base_version",
                "a delta applies to the base weights; an adapter update sends its tensors raw",
            )
        if self._retry or begin.base_version == self._place.delta_base:
            return
        have = (
            f"its base is {self._place.delta_base!r}"
            if self._place.delta_base
            else self._place.no_base_why
        )
        raise FailedPrecondition(
            f"begin.base_version: {begin.base_version!r} is not this server's delta base "
            f"({have}; GetServerInfo.delta_base_version); push a full update",
            reason=pb.ERROR_REASON_DELTA_BASE_MISMATCH,
        )

    @staticmethod
    def _wire_bytes(where: str, spec: pb.TensorSpec, nbytes: int, is_delta: bool) -> int:
        """How many bytes of the tensor travel; refuses a bad encoding."""
        enc = spec.encoding
        if enc not in pb.TensorEncoding.values():
            raise InvalidArgument(f"{where}.encoding", f"{spec.name}: unknown value {enc}")
        if is_delta and not spec.HasField("crc32c"):
            raise InvalidArgument(
                f"{where}.crc32c",
                f"{spec.name}: every tensor of a delta update declares the CRC-32C of its "
                "bytes (as reconstructed)",
            )
        if delta.is_raw(enc):
            if spec.encoded_bytes:
                raise InvalidArgument(
                    f"{where}.encoded_bytes", f"{spec.name}: set only for an encoded tensor"
                )
            return nbytes
        if not is_delta:
            raise InvalidArgument(
                f"{where}.encoding",
                f"{spec.name}: {pb.TensorEncoding.Name(enc)} needs begin.base_version",
            )
        if nbytes % delta.element(enc).itemsize:
            raise InvalidArgument(
                f"{where}.encoding",
                f"{spec.name}: {nbytes} bytes, not whole 16-bit words: send it raw "
                "or as SPARSE_XOR8",
            )
        most = delta.max_encoded_bytes(enc, nbytes)
        if not 0 < spec.encoded_bytes <= most:
            raise InvalidArgument(
                f"{where}.encoded_bytes",
                f"{spec.name}: {spec.encoded_bytes}, must be 1 to {most} for "
                f"{pb.TensorEncoding.Name(enc)} of {nbytes} bytes",
            )
        return spec.encoded_bytes

    def _check_groups(self, names: set[str]) -> None:
        """Every tensor of a fused module, or none (see param_groups.py)."""
        for i, spec in enumerate(self._begin_tensors):
            group = self._groups.get(spec.name, ())
            missing = [n for n in group if n not in names]
            if missing:
                raise InvalidArgument(
                    f"begin.tensors[{i}].name",
                    f"{spec.name} loads into one engine module together with "
                    f"{', '.join(missing)}: send all {len(group)} tensors of that group or none "
                    "(GetServerInfo.parameter_groups lists the groups)",
                )

    def add_chunks(self, chunks, where: str = "chunks") -> None:
        """A TensorChunkBatch's chunks, each as add_chunk, in order."""
        if len(chunks) > MAX_BATCH_CHUNKS:
            raise InvalidArgument(
                f"{where}.chunks", f"{len(chunks)} chunks, at most {MAX_BATCH_CHUNKS} in a batch"
            )
        for i, c in enumerate(chunks):
            self.add_chunk(c.tensor_index, c.offset, c.data, where=f"{where}.chunks[{i}]")

    def add_chunk(self, tensor_index: int, start: int, data, where: str = "chunk") -> None:
        """Validates one chunk and writes it into the region."""
        if tensor_index >= len(self._tensors):
            raise InvalidArgument(
                f"{where}.tensor_index",
                f"{tensor_index} is out of range: begin declared {len(self._tensors)} tensors",
            )
        t = self._tensors[tensor_index]
        size = len(data)
        if size == 0:
            raise InvalidArgument(f"{where}.data", f"{t.spec.name}: empty chunk")
        end = start + size
        if end > t.wire_nbytes:
            raise InvalidArgument(
                f"{where}.offset",
                f"{t.spec.name}: bytes [{start}, {end}) run past "
                f"the tensor's end ({t.wire_nbytes} bytes)",
            )
        refused = t.coverage.add(start, end)
        if refused == "overlap":
            raise InvalidArgument(
                f"{where}.offset",
                f"{t.spec.name}: bytes [{start}, {end}) overlap bytes already received",
            )
        if refused:
            raise InvalidArgument(
                f"{where}.offset",
                f"{t.spec.name}: its bytes so far form {MAX_RANGES} separate ranges, the most "
                "one tensor may; send each tensor's chunks in order",
            )
        assert self._buf is not None
        self._buf[t.offset + start : t.offset + end] = data
        self.bytes_received += size

    @property
    def tensor_offsets(self) -> list[int]:
        """Where each tensor of begin lies in the staging region."""
        return [t.offset for t in self._tensors]

    @property
    def total_bytes(self) -> int:
        return sum(t.wire_nbytes for t in self._tensors)

    @property
    def region(self) -> StagingRegion:
        """The region this update's bytes are written into."""
        return self._region

    def missing(self) -> list[tuple[int, int, int]]:
        """(tensor index, offset, length) of every byte range not received."""
        gaps = []
        for i, t in enumerate(self._tensors):
            pos = 0
            for start, end in zip(t.coverage.starts, t.coverage.ends):
                if start > pos:
                    gaps.append((i, pos, start - pos))
                pos = end
            if pos < t.wire_nbytes:
                gaps.append((i, pos, t.wire_nbytes - pos))
        return gaps

    def mark_written(self) -> None:
        """Counts every byte as received: a same-host client wrote them into
        the region itself (their checksums, when declared, are still checked)."""
        for t in self._tensors:
            t.coverage = _Coverage(starts=[0], ends=[t.wire_nbytes], received=t.wire_nbytes)
        self.bytes_received = self.total_bytes

    def _check_checksums(self) -> None:
        """Each declared CRC-32C against the bytes received. A tensor whose
        bytes do not match counts as not received again, so that a staged
        update, which stays open, can take corrected bytes for it (a byte is
        otherwise accepted only once)."""
        assert self._buf is not None
        bad = []
        for i, t in enumerate(self._tensors):
            # An encoded tensor's is of its reconstruction (delta_base.py).
            if t.spec.HasField("crc32c") and delta.is_raw(t.spec.encoding):
                got = crc32c.crc32c(self._buf[t.offset : t.offset + t.nbytes])
                if got != t.spec.crc32c:
                    bad.append((i, t, got))
        for _, t, _ in bad:
            self.bytes_received -= t.coverage.received
            t.coverage = _Coverage()
        if bad:
            i, t, got = bad[0]
            more = f" ({len(bad) - 1} more tensors too)" if len(bad) > 1 else ""
            raise InvalidArgument(
                f"begin.tensors[{i}].crc32c",
                f"{t.spec.name}: checksum mismatch (declared {t.spec.crc32c:#010x}, "
                f"received bytes {got:#010x}){more}; its bytes are discarded",
            )

    def finish(self, require_commit: bool = True) -> StagedUpdate:
        """Checks that the update is complete (and, for a stream, that it
        ended with commit); returns the staged update."""
        if self._begin is None:
            raise InvalidArgument("begin", "the stream ended before begin")
        if require_commit and not self._committed:
            raise InvalidArgument("commit", "the stream ended without commit")
        assert self._buf is not None
        for i, t in enumerate(self._tensors):
            if t.coverage.received != t.wire_nbytes:
                if self._begin.weight_version == self._current_version:
                    # Not a complete retry of the update that installed it.
                    raise FailedPrecondition(
                        f"begin.weight_version: {self._current_version!r} is already the "
                        f"served version, and this update is incomplete ({t.spec.name}: "
                        f"{t.coverage.received} of {t.nbytes} bytes)",
                        reason=pb.ERROR_REASON_VERSION_ALREADY_SERVED,
                    )
                raise InvalidArgument(
                    f"begin.tensors[{i}]",
                    f"{t.spec.name}: received {t.coverage.received} of {t.wire_nbytes} bytes",
                )
        self._check_checksums()
        if self._begin.base_version:
            return self._staged_delta(self._begin)
        return StagedUpdate(
            weight_version=self._begin.weight_version,
            pause_mode=self._begin.pause_mode,
            tensors=[
                StagedTensor(
                    name=t.spec.name,
                    dtype=dtypes.torch_name(t.spec.dtype),
                    shape=tuple(t.spec.shape),
                    offset=t.offset,
                    nbytes=t.nbytes,
                )
                for t in self._tensors
            ],
            bytes_received=self.bytes_received,
            declared_crcs={
                t.spec.name: t.spec.crc32c for t in self._tensors if t.spec.HasField("crc32c")
            },
            drain_timeout_seconds=self._begin.drain_timeout_seconds,
            adapter=self._begin.adapter if self._begin.HasField("adapter") else None,
            region=self._region,
        )

    def _staged_delta(self, begin: pb.UpdateWeightsBegin) -> StagedUpdate:
        """A complete delta: what to decode into which slot, and what the
        engine then loads: every tensor sent, and the rest of each of their
        parameter groups from the base (a fused module loads whole)."""
        sent = {t.spec.name for t in self._tensors}
        # A possible retry is compared by what it declares, never loaded.
        slots = self._place.slots or {}
        load = set(sent)
        for name in sent:
            load.update(self._groups.get(name, ()))
        plan = None
        if not self._retry:
            plan = DeltaPlan(
                base_version=begin.base_version,
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
                    for i, t in enumerate(self._tensors)
                ],
            )
        loaded = (
            [
                StagedTensor(
                    name=name,
                    dtype=dtypes.torch_name(spec.dtype),
                    shape=tuple(spec.shape),
                    offset=slots[name],
                    nbytes=dtypes.nbytes(spec.dtype, spec.shape),
                )
                for name, spec in self._manifest.items()
                if name in load
            ]
            if plan is not None
            else []
        )
        return StagedUpdate(
            weight_version=begin.weight_version,
            pause_mode=begin.pause_mode,
            tensors=loaded,
            bytes_received=self.bytes_received,
            declared_crcs={t.spec.name: t.spec.crc32c for t in self._tensors},
            drain_timeout_seconds=begin.drain_timeout_seconds,
            region=self._staging,
            base_version=begin.base_version,
            delta=plan,
            declared=tuple(
                (
                    t.spec.name,
                    t.spec.dtype,
                    tuple(t.spec.shape),
                    t.spec.encoding or delta.RAW,
                    t.spec.crc32c,
                )
                for t in self._tensors
            ),
        )
