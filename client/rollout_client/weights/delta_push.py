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
- memory: a copy of each recorded tensor, the size of the served model
  (while deltas lose by more than keeping that copy costs, samples of each
  tensor instead, at most 256 KiB each: delta_costs.py);
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

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rollout.v1 import rollout_pb2 as pb
from rollout_client.calls.connection import RolloutError
from rollout_client.weights.delta_costs import (
    Choice,
    Costs,
    PushRecord,
    Timer,
    read_samples,
    sampled_share,
    samples,
)
from rollout_client.weights.push import Update
from rollout_codecs import delta, extras
from rollout_codecs.sources import SourceTensor


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
    encode_seconds: float = 0.0  # all of delta(), CRC-32C included
    crc_seconds: float = 0.0  # summed over the tensors (threads overlap)
    encode_thread_seconds: float = 0.0  # encoding alone, summed likewise
    # Its encoded tensors are applied to the record already (`sending`).
    applied: bool = False

    @property
    def wire_bytes(self) -> int:
        return sum(t.nbytes for t in self.update.tensors)

    @property
    def model_bytes(self) -> int:
        return sum(t.source.nbytes for t in self.tensors)

    @property
    def encoded_bytes(self) -> int:
        """Bytes of the tensors that went through the encoder."""
        return sum(t.source.nbytes for t in self.tensors if t.sparse is not None)

    def measured(self) -> tuple[int, float, float]:
        """(bytes encoded, wall seconds of their encode, wall seconds of the
        CRC-32C of all): delta()'s wall time shared out by thread time."""
        busy = self.crc_seconds + self.encode_thread_seconds
        if busy <= 0:
            return self.encoded_bytes, 0.0, 0.0
        wall = self.encode_seconds
        return (
            self.encoded_bytes,
            wall * self.encode_thread_seconds / busy,
            wall * self.crc_seconds / busy,
        )

    @property
    def raw_tensors(self) -> int:
        return sum(1 for t in self.tensors if t.changed and t.spec.encoding == delta.RAW)


class PushedWeights:
    """The bytes a client last pushed to a server (see the module docstring)."""

    def __init__(self, max_bytes: int | None = None, zstd: bool = False) -> None:
        self.max_bytes = max_bytes
        self.zstd = zstd
        # The version the recorded bytes make on the server ("" : none).
        self.version = ""
        self._bytes: dict[str, np.ndarray] = {}
        # Instead of a copy, while deltas lose: samples of each tensor's
        # bytes as last pushed (delta_costs.samples), and its size.
        self._samples: dict[str, tuple[int, np.ndarray]] = {}
        # What earlier pushes measured: which way the next one goes (delta_costs.py).
        self.costs = Costs()
        self._warm = False

    @property
    def nbytes(self) -> int:
        """Host memory held by the record."""
        return sum(w.nbytes for w in self._bytes.values())

    def forget(self) -> None:
        self.version = ""
        self._bytes.clear()
        self._samples.clear()

    def plan(
        self, u: Update, has_base: bool, transport: Any, same_host: bool, always: bool = False
    ) -> tuple[DeltaUpdate | None, Choice]:
        """Which way `u` goes (delta_costs.Costs.choose; `always`: a delta
        whenever the server's base is the record's), and the delta if so."""
        if always:
            why = "delta='always'" if has_base else "no record of the server's delta base"
            choice = Choice("delta" if has_base else "full", why)
        else:
            names, sizes = [t.name for t in u.tensors], [t.nbytes for t in u.tensors]
            sampled = bool(self._samples) and not self.version
            choice = self.costs.choose(transport, same_host, has_base, names, sizes, sampled)
        if choice.way == "full":
            return None, choice
        if not self._warm:
            delta.warm_up()  # numba's compile (or its disk cache) is not an encode cost
            self._warm = True
        with Timer() as timer:
            d = self.delta(u, None if always else transport)
        d.encode_seconds = timer.seconds
        return d, choice

    def acknowledged(
        self,
        u: Update,
        d: DeltaUpdate | None,
        choice: Choice,
        ack: pb.UpdateWeightsResponse,
        seconds: float,
        transport: Any,
    ) -> None:
        """`d` (or, None, the full `u`) was acknowledged `seconds` after it
        was sent: recorded, its costs observed (delta_costs.py), its way and
        why kept in `costs.history`."""
        costs = self.costs
        names, sizes = [t.name for t in u.tensors], [t.nbytes for t in u.tensors]
        nbytes = sum(sizes)
        if d is not None:
            self.record_delta(d, ack.weight_version)  # counts or samples each share
            share = costs.share(names, sizes)
            transfer = costs.observe_delta(transport, names, sizes, d.measured(), ack, seconds)
            wire, raw, encode = d.wire_bytes, d.raw_tensors, d.encode_seconds
        else:
            transfer = costs.observe_full(transport, nbytes, ack, seconds)
            if choice.keep == "copy":
                with Timer() as timer:
                    self.record_full(u.tensors, ack)  # samples each share
                costs.observe_copy(nbytes, timer.seconds)
            elif choice.keep == "samples":
                self.record_samples(u.tensors)  # samples each share
            else:
                self.forget()
                for t in u.tensors:
                    t.release()
            share = costs.share(names, sizes)
            wire, raw, encode = nbytes, 0, 0.0
        costs.history.append(
            PushRecord(
                version=ack.weight_version,
                way="delta" if d is not None else "full",
                why=choice.why,
                model_bytes=nbytes,
                wire_bytes=wire,
                changed_share=share,
                encode_seconds=encode,
                transfer_seconds=transfer,
                raw_tensors=raw,
                predicted_delta_seconds=choice.predicted_delta,
                predicted_full_seconds=choice.predicted_full,
            )
        )

    def delta(self, u: Update, transport: Any = None, threads: int | None = None) -> DeltaUpdate:
        """`u` (a full update of the new bytes, from push.prepare) as a
        delta against the record; nothing is recorded until it is
        acknowledged. Each tensor goes encoded or raw, whichever `costs`
        says is cheaper on `transport` (delta_costs.py)."""
        costs = self.costs
        crc32c = extras.require("crc32c", "delta updates").crc32c
        if self.zstd:
            extras.require("zstandard", "the zstd delta encoding", extra="weights")

        timings: list[tuple[float, float]] = []  # (CRC, encode) s per tensor

        def encode(item: tuple[SourceTensor, pb.TensorSpec]) -> _Tensor:
            t, spec = item
            new = t.read(0, t.nbytes)
            out = pb.TensorSpec()
            out.CopyFrom(spec)
            t0 = time.perf_counter()
            out.crc32c = crc32c(new)
            t1 = time.perf_counter()
            e = encode_one(t, out, new)
            timings.append((t1 - t0, time.perf_counter() - t1))  # list.append: atomic
            return e

        def encode_one(t: SourceTensor, out: pb.TensorSpec, new: Any) -> _Tensor:
            old = self._bytes.get(t.name)
            if old is None or old.nbytes != t.nbytes:
                return _Tensor(t, out, new, new)
            if not costs.worth_encoding(transport, t.name, t.nbytes):
                out.encoding = delta.RAW
                return _Tensor(t, out, new, new)  # its share is sampled when recorded
            unit = delta.SPARSE if self.zstd and t.nbytes % 2 == 0 else delta.SPARSE8
            sparse = delta.encode_sparse(delta.elements(old, unit), delta.elements(new, unit))
            out.encoding = unit
            if sparse.size == 4:  # no entry: unchanged
                costs.shares[t.name] = 0.0
                out.encoded_bytes = 4
                return _Tensor(t, out, new, sparse, sparse, unit, changed=False)
            wire: Any = sparse
            if unit == delta.SPARSE:
                frame = delta.zstd_compress(sparse)
                if len(frame) < sparse.size:
                    wire, out.encoding = frame, delta.SPARSE_ZSTD
            share = costs.shares[t.name] = _share(sparse, t.nbytes)
            if not costs.keep_encoded(transport, len(wire), t.nbytes, share):
                out.encoding = delta.RAW
                return _Tensor(t, out, new, new, sparse, unit)  # encoded, sent raw
            out.encoded_bytes = len(wire)
            return _Tensor(t, out, new, wire, sparse, unit)

        with ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:
            encoded = list(pool.map(encode, zip(u.tensors, u.begin.tensors)))
        crc_s, encode_s = (sum(x) for x in zip(*timings)) if timings else (0.0, 0.0)
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
            state=u.state,  # one push: the delta and a full fallback share its state
        )
        return DeltaUpdate(
            update=update, tensors=encoded, crc_seconds=crc_s, encode_thread_seconds=encode_s
        )

    @contextlib.contextmanager
    def sending(self, d: DeltaUpdate) -> Iterator[None]:
        """While `d` is sent: its encoded tensors are applied to the record
        in a thread, alongside the server's receive, decode and load (not
        after the acknowledgement), and applied again (XOR undoes it) if the
        send fails. Measured at lr 1e-6 on a 0.31 GB model: 0.03 s taken off
        each delta's end to end."""
        try:
            with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                applying = [pool.submit(self._apply_one, e) for e in d.tensors]
                try:
                    yield
                finally:
                    for f in applying:
                        f.result()
                    d.applied = True
        except BaseException:
            self.withdraw(d)  # undone: the record is the base again
            raise

    def withdraw(self, d: DeltaUpdate) -> None:
        """`d` was applied to the record while it was sent (`sending`) and
        nobody acknowledged it (a Fleet whose every commit failed): the
        record is its base again (XOR undoes it)."""
        if d.applied:
            self._apply(d)
            d.applied = False

    def _apply(self, d: DeltaUpdate, threads: int | None = None) -> None:
        """XORs `d`'s encoded tensors into the record, `threads` at a time."""
        with ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:
            list(pool.map(self._apply_one, d.tensors))

    def _apply_one(self, e: _Tensor) -> None:
        if e.sparse is not None and e.changed and e.spec.encoding != delta.RAW:
            delta.apply_sparse(delta.elements(self._bytes[e.source.name], e.unit), e.sparse)

    def record_delta(self, d: DeltaUpdate, version: str, threads: int | None = None) -> None:
        """The delta was acknowledged as `version`: its tensors are applied
        to the record (unless `sending` did), `threads` at a time (a pass
        over the changed bytes), and its raw tensors copied."""
        if not d.applied:
            self._apply(d, threads)
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
        self._samples.clear()
        for t in tensors:
            self._keep(t.name, t.read(0, t.nbytes))
            t.release()
        self.version = ack.weight_version

    def record_samples(self, tensors: Sequence[SourceTensor]) -> None:
        """A full update of `tensors` was acknowledged, and no copy is kept:
        only samples of each tensor, against which the next full push
        measures its share of changed bytes. No delta can follow until a
        full push keeps its copy again."""
        for t in tensors:
            now = read_samples(t.read, t.nbytes)  # the sampled blocks only
            old = self._bytes.pop(t.name, None)
            before = self._samples.get(t.name) if old is None else (old.size, samples(old))
            if before is not None and before[0] == t.nbytes:
                self.costs.shares[t.name] = sampled_share(before[1], now)
            self._samples[t.name] = (t.nbytes, now)
            t.release()
        self._bytes.clear()
        self.version = ""

    def _keep(self, name: str, data: Any) -> None:
        new = np.frombuffer(data, dtype=np.uint8)
        old = self._bytes.get(name)
        if old is not None and old.shape == new.shape:
            # What a full push (or a raw tensor) changed, sampled: when
            # deltas would pay again (delta_costs.py).
            self.costs.shares[name] = sampled_share(old, new)
            np.copyto(old, new)
            return
        self._bytes.pop(name, None)
        room = None if self.max_bytes is None else self.max_bytes - self.nbytes
        if room is not None and new.nbytes > room:
            return  # pushed raw from now on
        self._bytes[name] = new.copy()


def push_cheaper(
    pushed: PushedWeights,
    u: Update,
    has_base: bool,
    transport: tuple[int, bool],
    send: Callable[[Update], pb.UpdateWeightsResponse],
    always: bool = False,
) -> pb.UpdateWeightsResponse:
    """update_weights(delta=...) of one client: `u` as the cheaper of a
    delta and a full update (`pushed.plan`), sent by `send`; a full update
    when the server refuses the delta's base. `transport`: (streams, same_host)."""
    d, choice = pushed.plan(u, has_base, transport, transport[1], always)
    if d is not None:
        t0 = time.perf_counter()
        try:
            with pushed.sending(d):
                ack = send(d.update)
        except RolloutError as e:
            if e.reason != "DELTA_BASE_MISMATCH":
                raise
            choice = Choice("full", "the server refused the delta's base (DELTA_BASE_MISMATCH)")
        else:
            pushed.acknowledged(u, d, choice, ack, time.perf_counter() - t0, transport)
            return ack
    t0 = time.perf_counter()
    ack = send(u)
    pushed.acknowledged(u, None, choice, ack, time.perf_counter() - t0, transport)
    return ack


def _share(sparse: np.ndarray, nbytes: int) -> float:
    """The share of a tensor's bytes (XOR8) or 16-bit words (XOR16) that
    changed, from its sparse encoding: a uint32 count K, then 2 bytes per
    XOR8 entry (of nbytes) or 4 per XOR16 entry (of nbytes / 2): (size - 4)
    / (2 nbytes) either way."""
    return (sparse.size - 4) / (2 * nbytes) if nbytes else 0.0


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
