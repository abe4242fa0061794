"""The delta encodings of a weight update (proto: TensorEncoding), in one
place: the client's encoder and the server's decoder are both here, so the
two sides cannot drift apart. The proto's comment on TensorEncoding is the
definition for other languages.

SPARSE_XOR16 reads a tensor's bytes as little-endian 16-bit words and lists
the words that changed: a uint32 count K, K uint16 XOR values, then K uint16
gaps (word p[i] = g[0] + ... + g[i] - 1). SPARSE_XOR16_ZSTD is the same bytes
in one zstd frame that states its content size. SPARSE_XOR8 is SPARSE_XOR16's
layout over the tensor's bytes (uint8 values and gaps): the usual RL change of
a bf16 value flips low bits only and costs 2 bytes, not 4, with no codec to
pay for. The element type of the arrays given (uint16 words or uint8 bytes)
says which of the two a function reads or writes.

The loops run compiled (delta_kernels.py) where numba is installed, else in
numpy, with the same bytes out. Neither holds the GIL: callers run one
tensor per thread.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import numpy as np

from rollout.v1 import rollout_pb2 as pb
from rollout_codecs import extras

RAW = pb.TENSOR_ENCODING_RAW
SPARSE = pb.TENSOR_ENCODING_SPARSE_XOR16
SPARSE_ZSTD = pb.TENSOR_ENCODING_SPARSE_XOR16_ZSTD
SPARSE8 = pb.TENSOR_ENCODING_SPARSE_XOR8
ENCODED = (SPARSE, SPARSE_ZSTD, SPARSE8)
# Entries decoded per block: bounds the temporary positions (8 bytes each).
_BLOCK = 1 << 20
_U16 = np.dtype("<u2")
_U8 = np.dtype("u1")


class DeltaError(ValueError):
    """Encoded bytes that do not decode (the message says why)."""


def is_raw(encoding: int) -> bool:
    return encoding in (pb.TENSOR_ENCODING_UNSPECIFIED, RAW)


def element(encoding: int) -> np.dtype:
    """What an entry of a sparse encoding names: a 16-bit word or a byte."""
    return _U8 if encoding == SPARSE8 else _U16


def _max_gap(unit: np.dtype) -> int:
    return (1 << (8 * unit.itemsize)) - 1


def sparse_bound(nbytes: int, encoding: int = SPARSE) -> int:
    """The most bytes SPARSE_XOR16 (or SPARSE_XOR8) takes for a tensor of
    `nbytes`: every element changed, plus the bridging entries."""
    unit = element(encoding)
    n = nbytes // unit.itemsize
    return 4 + 2 * unit.itemsize * (n + n // _max_gap(unit) + 1)


def max_encoded_bytes(encoding: int, nbytes: int) -> int:
    """The limit on TensorSpec.encoded_bytes (as the proto states it)."""
    s = sparse_bound(nbytes, encoding)
    return s + s // 128 + 1024 if encoding == SPARSE_ZSTD else s


def elements(buf: Any, encoding: int) -> np.ndarray:
    """`buf` as the elements `encoding`'s entries name (writable if it is)."""
    return np.frombuffer(buf, dtype=element(encoding))


@functools.cache
def kernels() -> ModuleType | None:
    """The compiled loops, or None without numba."""
    try:
        from rollout_codecs import delta_kernels
    except ImportError:
        return None
    return delta_kernels


def warm_up() -> None:
    """Compiles the loops now (a fraction of a second, then cached on disk),
    so that the first delta does not pay for it."""
    for encoding in (SPARSE, SPARSE8):
        w = np.arange(4, dtype=element(encoding))
        target = w.copy()
        payload = encode_sparse(w, w[::-1].copy())
        apply_sparse(target, payload)
        apply_sparse_crc(target, payload, encoding)


def encode_sparse(base: np.ndarray, new: np.ndarray, compiled: bool = True) -> np.ndarray:
    """SPARSE_XOR16 of `new` against `base` (uint16 word arrays of one
    length), or SPARSE_XOR8 (uint8 byte arrays), as a uint8 array.
    `compiled=False`: numpy even with numba."""
    unit = np.dtype(base.dtype)
    max_gap = _max_gap(unit)
    jit = kernels() if compiled else None
    if jit is not None:
        room = base.size + base.size // max_gap + 1
        # Pages of these are only touched as far as entries are written.
        values, gaps = np.empty(room, dtype=unit), np.empty(room, dtype=unit)
        k = int(jit.encode(base, new, values, gaps, max_gap))
        return _payload(values[:k], gaps[:k])
    x = np.bitwise_xor(base, new)
    at = np.flatnonzero(x)
    distance = np.diff(at, prepend=-1)
    pads = (distance - 1) // max_gap
    if not pads.any():
        return _payload(x[at], distance.astype(unit))
    # Each long distance becomes `pads` entries (x = 0, g = max_gap) before
    # the real one, which keeps the rest of it.
    real = np.cumsum(pads + 1) - 1
    k = int(real[-1]) + 1
    all_gaps = np.full(k, max_gap, dtype=unit)
    all_values = np.zeros(k, dtype=unit)
    all_gaps[real] = distance - pads * max_gap
    all_values[real] = x[at]
    return _payload(all_values, all_gaps)


def _payload(values: np.ndarray, gaps: np.ndarray) -> np.ndarray:
    k, size = values.size, values.itemsize
    out = np.empty(4 + 2 * size * k, dtype=np.uint8)
    out[:4] = np.frombuffer(k.to_bytes(4, "little"), dtype=np.uint8)
    out[4 : 4 + size * k].view(values.dtype)[:] = values
    out[4 + size * k :].view(values.dtype)[:] = gaps
    return out


def _entries(payload: Any, unit: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """The values and gaps of checked sparse bytes, as views."""
    k = int.from_bytes(bytes(payload[:4]), "little")
    size = unit.itemsize
    values = np.frombuffer(payload, dtype=unit, count=k, offset=4)
    gaps = np.frombuffer(payload, dtype=unit, count=k, offset=4 + size * k)
    return values, gaps


# The fused pass (apply, then CRC-32C) goes block by block, so that the CRC
# reads what the loop just touched from the cache, not from memory. (Fusing
# the encoder's CRC the same way measured slower: it stays two passes.)
_FUSED_BLOCK = 1 << 18


def apply_sparse_crc(target_bytes: Any, payload: Any, encoding: int = SPARSE) -> int:
    """apply_sparse of checked `encoding` bytes (SPARSE_XOR16 or XOR8) into
    the tensor `target_bytes` (a writable buffer), then the CRC-32C of the
    result, in one pass over memory where numba is installed."""
    import crc32c

    target = elements(target_bytes, encoding)
    jit = kernels()
    if jit is None:
        apply_sparse(target, payload)
        return int(crc32c.crc32c(target_bytes))
    view = memoryview(target_bytes).cast("B")
    size = target.itemsize
    values, gaps = _entries(payload, target.dtype)
    i, pos, crc = 0, -1, 0
    step = _FUSED_BLOCK // size
    for start in range(0, target.size, step):
        end = min(start + step, target.size)
        i, pos = jit.apply_block(target, values, gaps, i, pos, end)
        crc = crc32c.crc32c(view[size * start : size * end], crc)
    return int(crc)


def zstd_compress(payload: Any, level: int = 1) -> bytes:
    """SPARSE_XOR16 bytes as SPARSE_XOR16_ZSTD (the frame states its size)."""
    zstd = extras.require("zstandard", "the zstd delta encoding", extra="weights")
    frame: bytes = zstd.ZstdCompressor(level=level, write_content_size=True).compress(payload)
    return frame


def zstd_decompress(frame: Any, nbytes: int) -> bytes:
    """The SPARSE_XOR16 bytes inside a SPARSE_XOR16_ZSTD frame for a tensor
    of `nbytes`; DeltaError when the frame hides its size or claims more
    than such a tensor's SPARSE_XOR16 can take (checked before decompressing)."""
    import zstandard as zstd

    bound = sparse_bound(nbytes)
    try:
        size = zstd.frame_content_size(frame)
    except zstd.ZstdError as e:
        raise DeltaError(f"not a zstd frame ({e})") from None
    if size < 0:
        raise DeltaError("the zstd frame does not state its content size")
    if size > bound:
        raise DeltaError(f"the zstd frame holds {size} bytes, over the {bound} this tensor allows")
    try:
        out: bytes = zstd.ZstdDecompressor().decompress(frame, max_output_size=size)
        return out
    except zstd.ZstdError as e:
        raise DeltaError(f"the zstd frame does not decompress ({e})") from None


def check_sparse(payload: Any, count: int, encoding: int = SPARSE) -> int:
    """Checks SPARSE_XOR16 (or XOR8) bytes against a tensor of `count` words
    (or bytes) without writing anything; returns K. DeltaError says what is
    wrong."""
    unit = element(encoding)
    size, what = unit.itemsize, ("byte" if unit == _U8 else "word")
    n = len(payload)
    if n < 4:
        raise DeltaError(f"{n} bytes: shorter than the 4-byte entry count")
    k = int.from_bytes(bytes(payload[:4]), "little")
    if n != 4 + 2 * size * k:
        raise DeltaError(f"{n} bytes, but its entry count {k} makes it {4 + 2 * size * k}")
    gaps = np.frombuffer(payload, dtype=unit, count=k, offset=4 + size * k)
    if k and not gaps.all():
        raise DeltaError(f"gap {int(np.argmin(gaps))} is 0 (every gap is >= 1)")
    last = int(gaps.sum(dtype=np.int64)) - 1
    if last >= count:
        raise DeltaError(f"names {what} {last}, but the tensor has {count}")
    return k


def apply_sparse(target: np.ndarray, payload: Any, compiled: bool = True) -> None:
    """XORs checked (check_sparse) SPARSE_XOR16 bytes into `target`, the
    tensor's words (SPARSE_XOR8 bytes: its bytes, a uint8 array), in place.
    Applying the same bytes again undoes it."""
    values, gaps = _entries(payload, np.dtype(target.dtype))
    k = values.size
    jit = kernels() if compiled else None
    if jit is not None:
        jit.apply(target, values, gaps)
        return
    pos = -1
    for start in range(0, k, _BLOCK):
        at = np.cumsum(gaps[start : start + _BLOCK], dtype=np.int64)
        at += pos
        target[at] ^= values[start : start + _BLOCK]
        pos = int(at[-1])
