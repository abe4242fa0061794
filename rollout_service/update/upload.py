"""Receiving an update's bytes into the region its plan (plan.py) reserved.

Chunks come from one UpdateWeights stream, from any number of concurrent
UploadChunks streams, or (same host) were written by the client itself. Each
is checked to lie inside its tensor and every byte to be written exactly
once; at the end every byte must be in and each declared CRC-32C must
match, and `finish` returns the ReceivedUpdate (received.py). Pure Python
over a memoryview: tested without an engine.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

import crc32c

from rollout.v1 import rollout_pb2 as pb
from rollout_codecs import delta
from rollout_codecs.wire import RawChunk
from rollout_service.status.errors import FailedPrecondition, InvalidArgument
from rollout_service.update.plan import PlannedTensor, UpdatePlan
from rollout_service.update.received import ReceivedUpdate, received

# Chunks in one TensorChunkBatch (the proto says so).
MAX_BATCH_CHUNKS = 1024
# Separate byte ranges one tensor's received bytes may form: an in-order
# stream keeps one, parallel streams a few per stream; the bound keeps each
# insertion into the sorted lists cheap whatever order chunks come in.
MAX_RANGES = 1 << 16


@dataclass
class Coverage:
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

    @classmethod
    def whole(cls, nbytes: int) -> Coverage:
        return cls(starts=[0], ends=[nbytes], received=nbytes)


class Upload:
    """Writes the chunks of one planned update into `buf` (plan.reserve()).
    `writing` is told the names of the served model's slots the update
    writes into, each as its first byte comes (the transfer's: it marks
    them stale in the delta base, DeltaBase.writing)."""

    def __init__(
        self,
        plan: UpdatePlan,
        buf: memoryview,
        same_host: bool = False,
        writing: Callable[[set[str]], None] | None = None,
    ) -> None:
        self.plan = plan
        self._buf = buf
        self._tensors: tuple[PlannedTensor, ...] = plan.tensors
        self._coverage = [Coverage() for _ in plan.tensors]
        self._committed = False
        self.bytes_received = 0
        # When this update writes into the served model's slots: a slot is
        # stale from the first byte written into it, so that an update
        # aborted before any costs the delta base nothing. A same-host
        # client writes into the region itself, unseen: every slot is stale
        # from the moment the region is handed to it.
        self._writing = writing if plan.writes_slots else None
        if self._writing is not None and same_host:
            self._writing(plan.names)

    @property
    def total_bytes(self) -> int:
        return self.plan.total_bytes

    def feed(self, msg: pb.UpdateWeightsRequest | RawChunk) -> None:
        """One message of an UpdateWeights stream after its begin (a
        RawChunk: a chunk message parsed without protobuf, see wire.py)."""
        if isinstance(msg, RawChunk):
            if self._committed:
                raise InvalidArgument("commit", "a chunk message came after commit")
            return self.add_chunk(msg.tensor_index, msg.offset, msg.data)
        kind = msg.WhichOneof("kind")
        if self._committed:
            raise InvalidArgument("commit", f"a {kind or 'empty'} message came after commit")
        if kind == "begin":
            raise InvalidArgument("begin", "the stream has two begin messages")
        if kind == "chunk":
            self.add_chunk(msg.chunk.tensor_index, msg.chunk.offset, msg.chunk.data)
        elif kind == "chunks":
            self.add_chunks(msg.chunks.chunks)
        elif kind == "commit":
            self._committed = True
        else:
            raise InvalidArgument("kind", "message sets none of begin, chunk, chunks, commit")

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
        coverage = self._coverage[tensor_index]
        first = coverage.received == 0
        refused = coverage.add(start, end)
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
        if first and self._writing is not None:
            self._writing({t.spec.name})
        self._buf[t.offset + start : t.offset + end] = data
        self.bytes_received += size

    def missing(self) -> list[tuple[int, int, int]]:
        """(tensor index, offset, length) of every byte range not received."""
        gaps = []
        for i, (t, c) in enumerate(zip(self._tensors, self._coverage)):
            pos = 0
            for start, end in zip(c.starts, c.ends):
                if start > pos:
                    gaps.append((i, pos, start - pos))
                pos = end
            if pos < t.wire_nbytes:
                gaps.append((i, pos, t.wire_nbytes - pos))
        return gaps

    def mark_written(self) -> None:
        """Counts every byte as received: a same-host client wrote them into
        the region itself (their checksums, when declared, are still checked)."""
        self._coverage = [Coverage.whole(t.wire_nbytes) for t in self._tensors]
        self.bytes_received = self.total_bytes

    def finish(self, require_commit: bool = True) -> ReceivedUpdate:
        """Checks that the update is complete (and, for a stream, that it
        ended with commit); returns it. Time that grows with the update (the
        checksums): callers run it in a thread."""
        if require_commit and not self._committed:
            raise InvalidArgument("commit", "the stream ended without commit")
        current = self.plan.target.current_version
        for i, (t, c) in enumerate(zip(self._tensors, self._coverage)):
            if c.received != t.wire_nbytes:
                if self.plan.begin.weight_version == current:
                    # Not a complete retry of the update that installed it.
                    raise FailedPrecondition(
                        f"begin.weight_version: {current!r} is already the "
                        f"served version, and this update is incomplete ({t.spec.name}: "
                        f"{c.received} of {t.nbytes} bytes)",
                        reason=pb.ERROR_REASON_VERSION_ALREADY_SERVED,
                    )
                raise InvalidArgument(
                    f"begin.tensors[{i}]",
                    f"{t.spec.name}: received {c.received} of {t.wire_nbytes} bytes",
                )
        self._check_checksums()
        return received(self.plan, self.bytes_received)

    def _check_checksums(self) -> None:
        """Each declared CRC-32C against the bytes received. A tensor whose
        bytes do not match counts as not received again, so that a staged
        update, which stays open, can take corrected bytes for it (a byte is
        otherwise accepted only once)."""
        bad = []
        for i, t in enumerate(self._tensors):
            # An encoded tensor's is of its reconstruction (delta_base.py).
            if t.spec.HasField("crc32c") and delta.is_raw(t.spec.encoding):
                got = crc32c.crc32c(self._buf[t.offset : t.offset + t.nbytes])
                if got != t.spec.crc32c:
                    bad.append((i, t, got))
        for i, _, _ in bad:
            self.bytes_received -= self._coverage[i].received
            self._coverage[i] = Coverage()
        if bad:
            i, t, got = bad[0]
            more = f" ({len(bad) - 1} more tensors too)" if len(bad) > 1 else ""
            raise InvalidArgument(
                f"begin.tensors[{i}].crc32c",
                f"{t.spec.name}: checksum mismatch (declared {t.spec.crc32c:#010x}, "
                f"received bytes {got:#010x}){more}; its bytes are discarded",
            )
