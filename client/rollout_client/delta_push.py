"""Delta pushes: what a client last pushed, and a new source's update as a
delta against it (UpdateWeightsBegin.base_version; the encodings: delta.py).

`PushedWeights` records the bytes of every tensor a client pushed and had
acknowledged, and the version they make. When the server's
GetServerInfo.delta_base_version is that version, the next push sends each
tensor as the sparse XOR of its bytes against its record (SPARSE_XOR8), raw
when that would not be smaller than `raw_above` of its bytes, and not at all
when it did not change. Every tensor declares the CRC-32C of its new bytes,
which the server checks after decoding.

`PushedWeights(zstd=True)` sends SPARSE_XOR16 in a zstd frame instead (when
that is smaller): about a third fewer bytes than SPARSE_XOR8, for a codec
that runs at 0.2-0.3 GB/s of encoded bytes per core: worth it only on a link
much slower than that (BENCHMARKS.md, "Delta updates").

What it costs the trainer host:
- memory: a copy of each recorded tensor, the size of the served model;
  `PushedWeights(max_bytes=N)` records tensors only up to N bytes (the others
  are pushed raw every time);
- while a push is sent: the encoded bytes of every tensor (a few percent of
  the model at RL learning rates) and a view of each new tensor;
- time: one pass over old and new bytes per tensor, compiled with numba when
  it is installed, numpy otherwise (5 to 10 times slower); tensors are
  encoded `threads` at a time, before the update begins (its begin message
  states every encoded size, so that the server bounds its memory before it
  receives anything).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rollout.v1 import rollout_pb2 as pb
from rollout_client.push import Update
from rollout_codecs import delta, extras
from rollout_codecs.sources import SourceTensor

# A tensor is sent raw once its encoding would take more than this share of
# its bytes: the sparse encoding costs 4 bytes per changed 2-byte word.
RAW_ABOVE = 0.5


@dataclass
class _Tensor:
    """One tensor of a delta: what travels, and what to record once acknowledged."""

    source: SourceTensor
    spec: pb.TensorSpec
    new: Any  # the new bytes (a view)
    wire: Any  # the bytes that travel
    sparse: np.ndarray | None = None  # SPARSE_XOR8 or XOR16 bytes, for the record
    unit: int = delta.SPARSE8  # which of the two `sparse` is
    changed: bool = True


@dataclass
class DeltaUpdate:
    """A delta Update, and what `PushedWeights.record_delta` needs after it."""

    update: Update
    tensors: list[_Tensor] = field(default_factory=list)

    @property
    def wire_bytes(self) -> int:
        return sum(t.nbytes for t in self.update.tensors)


class PushedWeights:
    """The bytes a client last pushed to a server (see the module docstring)."""

    def __init__(self, max_bytes: int | None = None, zstd: bool = False) -> None:
        self.max_bytes = max_bytes
        self.zstd = zstd
        # The version the recorded bytes make on the server ("" : none).
        self.version = ""
        self._bytes: dict[str, np.ndarray] = {}

    @property
    def nbytes(self) -> int:
        """Host memory held by the record."""
        return sum(w.nbytes for w in self._bytes.values())

    def forget(self) -> None:
        self.version = ""
        self._bytes.clear()

    def delta(
        self, u: Update, raw_above: float = RAW_ABOVE, threads: int | None = None
    ) -> DeltaUpdate:
        """`u` (a full update of the new bytes, from push.prepare) as a
        delta against the record; nothing is recorded until it is acknowledged."""
        crc32c = extras.require("crc32c", "delta updates").crc32c
        if self.zstd:
            extras.require("zstandard", "the zstd delta encoding", extra="weights")

        def encode(item: tuple[SourceTensor, pb.TensorSpec]) -> _Tensor:
            t, spec = item
            new = t.read(0, t.nbytes)
            out = pb.TensorSpec()
            out.CopyFrom(spec)
            out.crc32c = crc32c(new)
            old = self._bytes.get(t.name)
            if old is None or old.nbytes != t.nbytes:
                return _Tensor(t, out, new, new)
            unit = delta.SPARSE if self.zstd and t.nbytes % 2 == 0 else delta.SPARSE8
            sparse = delta.encode_sparse(delta.elements(old, unit), delta.elements(new, unit))
            out.encoding = unit
            if sparse.size == 4:  # no entry: unchanged
                out.encoded_bytes = 4
                return _Tensor(t, out, new, sparse, sparse, unit, changed=False)
            wire: Any = sparse
            if unit == delta.SPARSE:
                frame = delta.zstd_compress(sparse)
                if len(frame) < sparse.size:
                    wire, out.encoding = frame, delta.SPARSE_ZSTD
            if len(wire) > raw_above * t.nbytes:
                out.encoding = delta.RAW
                return _Tensor(t, out, new, new)
            out.encoded_bytes = len(wire)
            return _Tensor(t, out, new, wire, sparse, unit)

        with ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:
            encoded = list(pool.map(encode, zip(u.tensors, u.begin.tensors)))
        sent = [e for e in encoded if e.changed] or encoded[:1]
        begin = pb.UpdateWeightsBegin()
        begin.CopyFrom(u.begin)
        begin.base_version = self.version
        del begin.tensors[:]
        begin.tensors.extend(e.spec for e in sent)
        update = Update(
            tensors=[_wire_tensor(e) for e in sent],
            begin=begin,
            chunk_bytes=u.chunk_bytes,
            timeout=u.timeout,
            metadata=u.metadata,
            batch_chunks=u.batch_chunks,
        )
        return DeltaUpdate(update=update, tensors=encoded)

    def record_delta(self, d: DeltaUpdate, version: str, threads: int | None = None) -> None:
        """The delta was acknowledged as `version`: its tensors are applied
        to the record, `threads` at a time (a pass over the model's bytes)."""

        def record(e: _Tensor) -> None:
            if e.sparse is not None and e.changed and e.spec.encoding != delta.RAW:
                delta.apply_sparse(delta.elements(self._bytes[e.source.name], e.unit), e.sparse)

        with ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:
            list(pool.map(record, d.tensors))
        for e in d.tensors:
            if e.changed and (e.sparse is None or e.spec.encoding == delta.RAW):
                self._keep(e.source.name, e.new)  # may drop records past max_bytes: in order
            e.source.release()
        self.version = version

    def record_full(self, tensors: Sequence[SourceTensor], ack: pb.UpdateWeightsResponse) -> None:
        """A full update of `tensors` was acknowledged (`ack`). Tensors it
        left out keep their record only if it was made on the version the
        update replaced."""
        if ack.previous_weight_version != self.version:
            self._bytes.clear()
        for t in tensors:
            self._keep(t.name, t.read(0, t.nbytes))
            t.release()
        self.version = ack.weight_version

    def _keep(self, name: str, data: Any) -> None:
        new = np.frombuffer(data, dtype=np.uint8)
        old = self._bytes.get(name)
        if old is not None and old.shape == new.shape:
            np.copyto(old, new)
            return
        self._bytes.pop(name, None)
        room = None if self.max_bytes is None else self.max_bytes - self.nbytes
        if room is not None and new.nbytes > room:
            return  # pushed raw from now on
        self._bytes[name] = new.copy()


def _wire_tensor(e: _Tensor) -> SourceTensor:
    """The bytes of `e` that travel, as a source the senders read."""
    view = memoryview(e.wire).cast("B")
    return SourceTensor(
        name=e.source.name,
        dtype=e.source.dtype,
        shape=e.source.shape,
        nbytes=len(view),
        read=lambda off, n: view[off : off + n],
        read_into=lambda off, buf: buf.__setitem__(slice(None), view[off : off + len(buf)]),
    )
