"""Which way a push goes (update_weights(delta=True)): a delta or a full
update, and each tensor of a delta encoded or raw, from what earlier pushes
measured on this client, not from a fixed share of changed values.

What is measured, push by push (`Costs.observe_*`):
- the transport: model bytes per second a full push moved, end to end from
  the client's call to the acknowledgement, less the server's apply and
  cache reset (UpdateTimings: the same work whichever way the bytes came);
- the delta: the client's encode seconds per model byte and the same end to
  end of the delta's call, as lines in the share of changed bytes (a delta's
  encode and decode pay per changed value; at one share a line is flat);
- each tensor's share of changed bytes: counted while it is encoded, or
  sampled when a full push replaces its record (`sampled_share`), so that a
  run that went to full pushes sees when deltas would pay again;
- what keeping a full push's copy (the next delta's base) costs: seconds
  per byte of the copy.

The choice (`Costs.choose`), before anything is encoded:
- same host: full (the full push there is one copy into the staging region;
  a delta reads the old bytes and the new, so it cannot be cheaper);
- no record on the server's base: full (nothing to encode against);
- no delta measured yet on this transport: a delta (the first one measures);
- else the predicted delta against the predicted full push: the cheaper
  one, except that after WINDOW full pushes in a row one delta goes out to
  measure again.
A full push keeps a copy of its bytes as the next delta's base, unless the
delta lost by more than the copy costs, or every tensor of it would have gone
raw: then it keeps only samples of each tensor (`samples`), enough to follow
the share of changed bytes, and the copy's pass over the model is saved while
deltas lose. When the samples show that a delta would pay again, that push
goes full and keeps its copy, and the next one is a delta.
And per tensor, once encoded: the encoded bytes if sending them costs less
than sending the raw bytes at the measured transport rate, with the server's
decode of them added; raw otherwise (`Costs.keep_encoded`).

Every push leaves a `PushRecord` in `Costs.history`: which way it went, why,
and what it measured.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Observations each line is fitted on: the last few pushes, so that a run's
# costs may drift (a warm cache, another job on the host) and be followed.
WINDOW = 8
# Before any transport rate is measured, a tensor's encoding is kept when it
# is at most this share of the raw bytes (the encoder's old fixed rule).
PRIOR_RAW_ABOVE = 0.5
# Bytes compared per block and blocks per tensor when a full push samples
# the share of changed bytes (`sampled_share`): ~1 % of a large tensor.
SAMPLE_BLOCK = 4096
SAMPLE_BLOCKS = 64


@dataclass(frozen=True)
class PushRecord:
    """One push: `way` "delta" or "full", `why` the reason in words."""

    version: str
    way: str
    why: str
    model_bytes: int
    wire_bytes: int
    # Share of the pushed bytes that changed (counted by a delta's encoder,
    # sampled by a full push over a record; None: nothing to compare with).
    changed_share: float | None
    encode_seconds: float
    # The call, end to end, less the server's apply and reset.
    transfer_seconds: float
    raw_tensors: int = 0
    predicted_delta_seconds: float | None = None
    predicted_full_seconds: float | None = None


def samples(a: np.ndarray) -> np.ndarray:
    """Up to SAMPLE_BLOCKS evenly spaced blocks of `a` (a uint8 view), as one
    new array: the whole of a small tensor."""
    return read_samples(lambda offset, n: a[offset : offset + n], a.size)


def read_samples(read: Callable[[int, int], Any], nbytes: int) -> np.ndarray:
    """`samples` of a tensor of `nbytes` that `read(offset, n)` reads (a
    SourceTensor's): only the sampled blocks are read, so that a tensor in a
    checkpoint file is not read whole for 1 % of it."""
    if nbytes <= SAMPLE_BLOCK * SAMPLE_BLOCKS:
        return np.frombuffer(read(0, nbytes), dtype=np.uint8).copy()
    starts = np.linspace(0, nbytes - SAMPLE_BLOCK, SAMPLE_BLOCKS).astype(np.int64)
    return np.concatenate(
        [np.frombuffer(read(int(s), SAMPLE_BLOCK), dtype=np.uint8) for s in starts]
    )


def sampled_share(old: np.ndarray, new: np.ndarray) -> float:
    """The share of bytes that differ between `old` and `new` (uint8 views
    of one size, or their `samples`), over the sampled blocks."""
    if old.size != new.size:
        raise ValueError(f"{old.size} bytes against {new.size}")
    if old.size > SAMPLE_BLOCK * SAMPLE_BLOCKS:
        old, new = samples(old), samples(new)
    return float(np.count_nonzero(old != new)) / max(old.size, 1)


@dataclass
class _Line:
    """y = a + b * share, least squares over the last WINDOW points; flat
    (the mean) while the points do not spread over shares."""

    points: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    # (intercept, slope) of the points, fitted once per point added: a
    # prediction asks for every tensor of the model (0.1 s for 300 tensors
    # when each fitted again).
    _fit: tuple[float, float] | None = None

    def add(self, share: float, y: float) -> None:
        self.points.append((share, y))
        self._fit = None

    def __bool__(self) -> bool:
        return bool(self.points)

    def at(self, share: float) -> float:
        if self._fit is None:
            xs = np.array([p[0] for p in self.points])
            ys = np.array([p[1] for p in self.points])
            if len(xs) < 2 or float(np.ptp(xs)) < 1e-6:
                self._fit = (float(ys.mean()), 0.0)
            else:
                slope, intercept = np.polyfit(xs, ys, 1)
                self._fit = (float(intercept), float(slope))
        intercept, slope = self._fit
        return max(intercept + slope * share, 0.0) if slope else intercept


@dataclass
class _Transport:
    full: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))  # s per byte
    decode: _Line = field(default_factory=_Line)  # the server's decode, s per byte
    # Actual over predicted seconds of the deltas sent: what the model
    # misses (a delta's own fixed costs) and what the last pushes showed.
    misses: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    fulls_since_delta: int = 0

    def per_byte(self) -> float | None:
        """Seconds per model byte of a full push (median), if measured."""
        return float(statistics.median(self.full)) if self.full else None

    def miss(self) -> float:
        return float(statistics.median(self.misses)) if self.misses else 1.0


@dataclass(frozen=True)
class Choice:
    way: str  # "delta" or "full"
    why: str
    predicted_delta: float | None = None
    predicted_full: float | None = None
    # What a full push leaves behind: "copy" (its bytes, the next delta's
    # base: the model's size), "samples" (`samples` of each tensor, to follow
    # the share of changed bytes) or "nothing".
    keep: str = "copy"

    @property
    def record(self) -> bool:
        """A full push keeps its copy."""
        return self.keep == "copy"


class Costs:
    """What this client's pushes measured, per transport (streams,
    same_host), and the choices made from it (see the module docstring)."""

    def __init__(self) -> None:
        self._by: dict[Any, _Transport] = {}
        self.encode = _Line()  # the client's encode, s per byte encoded, by share
        self.crc: deque[float] = deque(maxlen=WINDOW)  # CRC-32C, s per byte
        self.shares: dict[str, float] = {}  # last share of changed bytes, by tensor
        self.copy: deque[float] = deque(maxlen=WINDOW)  # keeping a full push's copy, s per byte
        self.history: list[PushRecord] = []

    def transport(self, key: Any) -> _Transport:
        return self._by.setdefault(key, _Transport())

    def share(self, names: Sequence[str], sizes: Sequence[int]) -> float | None:
        """The share of changed bytes last seen over these tensors (None:
        none of them seen yet)."""
        seen = [(self.shares[n], s) for n, s in zip(names, sizes) if n in self.shares]
        if not seen:
            return None
        total = sum(s for _, s in seen)
        return sum(x * s for x, s in seen) / max(total, 1)

    # -- predictions ---------------------------------------------------------

    def _tensor(
        self, t: _Transport, share: float, nbytes: int, rates: tuple[float, float] | None = None
    ) -> tuple[float, float]:
        """Predicted seconds of one tensor in a delta: encoded (encode,
        SPARSE_XOR8's 2 bytes per changed byte on the wire, decode) and raw
        (its bytes on the wire); either way its CRC-32C, which every tensor
        of a delta declares. `rates`: `_rates(t)`, when the caller asks for
        many tensors."""
        per_byte, crc_per_byte = rates or self._rates(t)
        crc = crc_per_byte * nbytes
        work = (self.encode.at(share) + (t.decode.at(share) if t.decode else 0.0)) * nbytes
        return work + crc + (4 + 2 * share * nbytes) * per_byte, nbytes * per_byte + crc

    def _rates(self, t: _Transport) -> tuple[float, float]:
        """(transport, CRC-32C) seconds per byte: medians of what was measured."""
        per_byte = t.per_byte()
        assert per_byte is not None
        return per_byte, float(statistics.median(self.crc)) if self.crc else 0.0

    def predict(
        self, key: Any, names: Sequence[str], sizes: Sequence[int], miss: float | None = None
    ) -> tuple[float, float] | None:
        """(delta, full) seconds for these tensors at the shares last seen,
        each tensor the way the encoder will send it (`worth_encoding`: the
        components' costs, encoded against raw), an encoded tensor's cost
        times what the last deltas missed (`miss`, the measured one by
        default); None while either cannot be predicted. The miss scales a
        cost but does not pick the way: deltas faster than predicted must not
        make 2 bytes per changed byte cheaper than the raw bytes past half
        changed. A delta of raw tensors only is a full push and a CRC-32C per
        tensor: never the cheaper."""
        t = self.transport(key)
        tensors = self._tensors(t, names, sizes)
        if tensors is None:
            return None
        factor = t.miss() if miss is None else miss
        delta = sum(encoded * factor if encoded < raw else raw for encoded, raw in tensors)
        return delta, self._rates(t)[0] * sum(sizes)

    def encodes_any(self, key: Any, names: Sequence[str], sizes: Sequence[int]) -> bool:
        """Whether a delta of these tensors now would send any of them
        encoded (predict's per-tensor choice); if none, it is the full push
        and a CRC-32C per tensor."""
        tensors = self._tensors(self.transport(key), names, sizes)
        return tensors is None or any(encoded < raw for encoded, raw in tensors)

    def _tensors(
        self, t: _Transport, names: Sequence[str], sizes: Sequence[int]
    ) -> list[tuple[float, float]] | None:
        """`_tensor` of each of these tensors at the share last seen (a
        tensor never seen: the mean of the others); None while no full push
        or no encode was measured, or none of them was seen."""
        mean = self.share(names, sizes)
        if t.per_byte() is None or mean is None or not self.encode:
            return None
        rates = self._rates(t)
        return [self._tensor(t, self.shares.get(n, mean), b, rates) for n, b in zip(names, sizes)]

    def choose(
        self,
        key: Any,
        same_host: bool,
        has_base: bool,
        names: Sequence[str],
        sizes: Sequence[int],
        sampled: bool = False,
    ) -> Choice:
        """`sampled`: the client keeps samples of the last push, not a copy."""
        if same_host:
            # Nor is the copy kept: it would cost as much again.
            why = "same host: a full push is one copy, a delta reads twice"
            return Choice("full", why, keep="nothing")
        if not has_base:
            predicted = self.predict(key, names, sizes) if sampled else None
            if predicted is None:
                return Choice("full", "no record of the server's delta base")
            d, f = predicted
            costs = self._costs(d, f, names, sizes)
            if d < f or self.transport(key).fulls_since_delta + 1 >= WINDOW:
                why = f"a delta may pay again ({costs}): this push is kept as the next one's base"
                return Choice("full", why, d, f)
            return Choice("full", f"{costs}; samples kept, not a copy", d, f, keep="samples")
        if not self.transport(key).misses:
            return Choice("delta", "no delta measured yet on this transport")
        predicted = self.predict(key, names, sizes)
        if predicted is None:
            return Choice("delta", "no full push measured yet on this transport")
        d, f = predicted
        costs = self._costs(d, f, names, sizes)
        if d >= f and self.transport(key).fulls_since_delta >= WINDOW:
            # What the last deltas missed may be stale (a slower host then):
            # one delta in WINDOW + 1 pushes measures again.
            return Choice("delta", f"measuring again after {WINDOW} full pushes; {costs}", d, f)
        if d < f:
            return Choice("delta", costs, d, f)
        if self._keep_copy(key, d, f, names, sizes):
            return Choice("full", costs, d, f)
        return Choice("full", f"{costs}; samples kept, not a copy", d, f, keep="samples")

    def _costs(self, d: float, f: float, names: Sequence[str], sizes: Sequence[int]) -> str:
        share = self.share(names, sizes) or 0.0
        return f"delta {d:.3f} s, full {f:.3f} s predicted at {share:.2%} changed"

    def _keep_copy(
        self, key: Any, d: float, f: float, names: Sequence[str], sizes: Sequence[int]
    ) -> bool:
        """A full push that a delta lost to keeps its copy when the next push
        measures a delta again (it needs a base), or when the delta lost by
        less than the copy costs with some tensor encoded (a close call the
        next push may turn); not when every tensor would have gone raw."""
        if self.transport(key).fulls_since_delta + 1 >= WINDOW:
            return True
        copy = float(statistics.median(self.copy)) * sum(sizes) if self.copy else 0.0
        return d < f + copy and self.encodes_any(key, names, sizes)

    def worth_encoding(self, key: Any, name: str, nbytes: int) -> bool:
        """Encode a tensor at all: unless, at the share of its bytes that
        changed last time, encoded costs more than raw (`_tensor`)."""
        t = self.transport(key)
        share = self.shares.get(name)
        if share is None or t.per_byte() is None or not self.encode:
            return True
        encoded, raw = self._tensor(t, share, nbytes)
        return encoded < raw

    def keep_encoded(self, key: Any, encoded: int, nbytes: int, share: float) -> bool:
        """Send a tensor's `encoded` bytes rather than its `nbytes` raw (the
        encode is paid by now): when they cost less on this transport, the
        server's decode included."""
        t = self.transport(key)
        per_byte = t.per_byte()
        if per_byte is None:
            return encoded <= PRIOR_RAW_ABOVE * nbytes
        decode = t.decode.at(share) * nbytes if t.decode else 0.0
        return encoded * per_byte + decode < nbytes * per_byte

    # -- what a push measured ------------------------------------------------

    def observe_copy(self, nbytes: int, seconds: float) -> None:
        """A full push's copy of `nbytes` took `seconds` to keep."""
        if nbytes:
            self.copy.append(seconds / nbytes)

    def observe_full(self, key: Any, nbytes: int, ack: Any, seconds: float) -> float:
        transfer = _transfer(ack, seconds)
        t = self.transport(key)
        t.fulls_since_delta += 1
        if nbytes:
            t.full.append(transfer / nbytes)
        return transfer

    def observe_delta(
        self,
        key: Any,
        names: Sequence[str],
        sizes: Sequence[int],
        encoded: tuple[int, float, float],
        ack: Any,
        seconds: float,
    ) -> float:
        """A delta of these tensors was acknowledged `seconds` after it was
        sent; `encoded`: the bytes encoded, the seconds their encode took and
        the seconds of the CRC-32C of all. The shares are the ones it counted."""
        transfer = _transfer(ack, seconds)
        nbytes, encode_s, crc_s = encoded
        share = self.share(names, sizes) or 0.0
        t = self.transport(key)
        t.fulls_since_delta = 0
        total = sum(sizes)
        if total:
            self.crc.append(crc_s / total)
        if nbytes:
            self.encode.add(share, encode_s / nbytes)
            t.decode.add(share, ack.timings.decode_seconds / nbytes)
        predicted = self.predict(key, names, sizes, miss=1.0)
        if predicted is not None and predicted[0] > 0:
            # Against the prediction at the shares this delta found, from
            # the components alone: what they miss.
            t.misses.append((encode_s + crc_s + transfer) / predicted[0])
        return transfer


def _transfer(ack: Any, seconds: float) -> float:
    """The call's seconds less the server's apply and reset (the same work
    for a delta and a full push)."""
    t = ack.timings
    return max(seconds - float(t.apply_seconds) - float(t.reset_seconds), 0.0)


class Timer:
    def __enter__(self) -> Timer:
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.seconds = time.perf_counter() - self.t0
