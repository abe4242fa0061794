"""Compiled loops of the sparse delta encoding (delta.py), for hosts that have
numba (every server: vLLM requires it; a trainer host may not, and delta.py
then falls back to numpy, bit for bit the same, 3 to 5 times slower).

Each walks the elements once, in order. `nogil`: callers
run one tensor per thread. `cache`: compiled once per install, in this
package's __pycache__.

Each is compiled per element type: uint16 words (SPARSE_XOR16) or uint8
bytes (SPARSE_XOR8), whose longest gap the caller passes.

`trailing_zeros` is numba's own intrinsic (count trailing zeros); a numba
without it fails this import, and delta.py falls back to numpy.
"""

from __future__ import annotations

import numba
import numpy as np
from numba.cpython.unsafe.numbers import trailing_zeros


@numba.njit(nogil=True, cache=True)
def _entry(values, gaps, k, prev, j, x, max_gap):  # type: ignore[no-untyped-def]
    """Writes the entry of element `j` (XOR `x`) after the one of element
    `prev`, bridging a distance over `max_gap`; returns the next k."""
    d = j - prev
    while d > max_gap:
        values[k] = 0
        gaps[k] = max_gap
        k += 1
        d -= max_gap
    values[k] = x
    gaps[k] = d
    return k + 1


@numba.njit(nogil=True, cache=True)
def encode(
    base: np.ndarray, new: np.ndarray, values: np.ndarray, gaps: np.ndarray, max_gap: int
) -> int:
    """Writes the entries of `new` against `base` into `values` and `gaps`
    (room for every element plus the bridging entries); returns their count.

    It compares 8 bytes at a time and skips equal ones; in a word that
    differs it takes the changed elements lowest first (count trailing
    zeros). Measured on bytes (SPARSE_XOR8) against a loop with one branch
    per element, which writes the same entries: 2.0x as fast with 0.6 % of
    the bytes changed, 1.6x at 1.3 % (an RL step at lr 1e-6), the same at
    5-10 % (each change costs a mispredicted branch in both), 1.1x at 20 %."""
    per = 8 // base.itemsize
    bits = np.uint64(8 * base.itemsize)
    mask = np.uint64((1 << (8 * base.itemsize)) - 1)
    words = base.size // per
    b64 = base[: words * per].view(np.uint64)
    n64 = new[: words * per].view(np.uint64)
    k = 0
    prev = -1
    for w in range(words):
        x = b64[w] ^ n64[w]
        while x:
            shift = np.uint64(trailing_zeros(x)) & ~(bits - np.uint64(1))  # the element's
            j = w * per + int(shift // bits)
            k = _entry(values, gaps, k, prev, j, (x >> shift) & mask, max_gap)
            prev = j
            x &= ~(mask << shift)
    for j in range(words * per, base.size):
        x1 = base[j] ^ new[j]
        if x1:
            k = _entry(values, gaps, k, prev, j, x1, max_gap)
            prev = j
    return k


@numba.njit(nogil=True, cache=True)
def apply(target: np.ndarray, values: np.ndarray, gaps: np.ndarray) -> None:
    """XORs checked entries into `target` in place."""
    p = -1
    for i in range(values.size):
        p += gaps[i]
        target[p] ^= values[i]


@numba.njit(nogil=True, cache=True)
def apply_block(
    target: np.ndarray, values: np.ndarray, gaps: np.ndarray, i: int, pos: int, end: int
) -> tuple[int, int]:
    """`apply` of the entries from `i` on (the one before named word `pos`)
    that name words below `end`; returns the next (i, pos)."""
    n = values.size
    while i < n:
        p = pos + gaps[i]
        if p >= end:
            break
        target[p] ^= values[i]
        pos = p
        i += 1
    return i, pos
