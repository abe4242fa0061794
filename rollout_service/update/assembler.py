"""Assembling one UpdateWeights stream into the staging region.

Everything about the stream is validated here, before anything touches the
engine: the message order, tensor names/dtypes/shapes against the manifest,
that chunks lie inside their tensor and that every byte is written exactly
once, the checksums and the size limit. Pure Python over a memoryview: tested
without an engine.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import crc32c

from rollout.v1 import rollout_pb2 as pb
from rollout_client import dtypes
from rollout_client.wire import RawChunk
from rollout_service.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from rollout_service.staged import StagedTensor

# Tensors start on this alignment inside the region.
ALIGN = 64


@dataclass
class _Coverage:
    """Byte ranges of one tensor written so far: sorted, disjoint, merged."""

    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    received: int = 0

    def add(self, start: int, end: int) -> bool:
        """Records [start, end); False when it overlaps a recorded range."""
        i = bisect.bisect_right(self.starts, start)
        if i > 0 and self.ends[i - 1] > start:
            return False
        if i < len(self.starts) and self.starts[i] < end:
            return False
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
        return True


@dataclass
class _Staged:
    spec: pb.TensorSpec
    offset: int
    nbytes: int
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

    @property
    def names(self) -> set[str]:
        return {t.name for t in self.tensors}

    def content(self, buf) -> tuple:
        """What identifies this update's bytes: every tensor's name, dtype,
        shape and CRC-32C (computed here where the client declared none).
        A retry of an applied update is recognised by it."""
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
        self._staging = staging
        self._begin: pb.UpdateWeightsBegin | None = None
        self._tensors: list[_Staged] = []
        self._buf: memoryview | None = None
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
        elif kind == "commit":
            self._committed = True
        else:
            raise InvalidArgument("kind", "message sets none of begin, chunk, commit")

    def begin(self, begin: pb.UpdateWeightsBegin) -> None:
        """Validates `begin` (a staged update's, without a stream)."""
        if self._begin is not None:
            raise InvalidArgument("begin", "the update has two begin messages")
        self._on_begin(begin)

    def _on_begin(self, begin: pb.UpdateWeightsBegin) -> None:
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
        seen: set[str] = set()
        offset = 0
        self._begin_tensors = begin.tensors
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
            self._tensors.append(_Staged(spec=spec, offset=offset, nbytes=nbytes))
            offset += -(-nbytes // ALIGN) * ALIGN
        self._check_groups(seen)
        if offset > self._max_bytes:
            raise ResourceExhausted(
                f"begin.tensors: the update is {offset} bytes, over the limit of "
                f"{self._max_bytes} bytes (max_update_bytes)"
            )
        self._begin = begin
        self._buf = self._staging.ensure(offset)

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

    def add_chunk(self, tensor_index: int, start: int, data) -> None:
        """Validates one chunk and writes it into the region."""
        if tensor_index >= len(self._tensors):
            raise InvalidArgument(
                "chunk.tensor_index",
                f"{tensor_index} is out of range: begin declared {len(self._tensors)} tensors",
            )
        t = self._tensors[tensor_index]
        size = len(data)
        if size == 0:
            raise InvalidArgument("chunk.data", f"{t.spec.name}: empty chunk")
        end = start + size
        if end > t.nbytes:
            raise InvalidArgument(
                "chunk.offset",
                f"{t.spec.name}: bytes [{start}, {end}) run past "
                f"the tensor's end ({t.nbytes} bytes)",
            )
        if not t.coverage.add(start, end):
            raise InvalidArgument(
                "chunk.offset",
                f"{t.spec.name}: bytes [{start}, {end}) overlap bytes already received",
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
        return sum(t.nbytes for t in self._tensors)

    def missing(self) -> list[tuple[int, int, int]]:
        """(tensor index, offset, length) of every byte range not received."""
        gaps = []
        for i, t in enumerate(self._tensors):
            pos = 0
            for start, end in zip(t.coverage.starts, t.coverage.ends):
                if start > pos:
                    gaps.append((i, pos, start - pos))
                pos = end
            if pos < t.nbytes:
                gaps.append((i, pos, t.nbytes - pos))
        return gaps

    def mark_written(self) -> None:
        """Counts every byte as received: a same-host client wrote them into
        the region itself (their checksums, when declared, are still checked)."""
        for t in self._tensors:
            t.coverage = _Coverage(starts=[0], ends=[t.nbytes], received=t.nbytes)
        self.bytes_received = self.total_bytes

    def _check_checksums(self) -> None:
        """Each declared CRC-32C against the bytes received. A tensor whose
        bytes do not match counts as not received again, so that a staged
        update, which stays open, can take corrected bytes for it (a byte is
        otherwise accepted only once)."""
        assert self._buf is not None
        bad = []
        for i, t in enumerate(self._tensors):
            if t.spec.HasField("crc32c"):
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
            if t.coverage.received != t.nbytes:
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
                    f"{t.spec.name}: received {t.coverage.received} of {t.nbytes} bytes",
                )
        self._check_checksums()
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
        )
