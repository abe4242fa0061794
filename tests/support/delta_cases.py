"""The SPARSE_XOR8 edge cases every client's encoder is checked on against
rollout_codecs.delta's (the C++ and the Node client's tests): a tensor of
`nbytes` random bytes and the same with the bytes `at` changed."""

from __future__ import annotations

import numpy as np
import pytest

XOR8_CASES = [
    pytest.param(5000, [3, 1000], id="far-apart"),  # bridged by (0, 255) entries
    pytest.param(5000, [254, 509, 765, 766, 4999], id="gap-edges"),  # gaps 255, 256, then 1
    pytest.param(1001, [0, 1000], id="odd-length"),  # the first and the last byte
    pytest.param(3000, [], id="no-change"),  # K = 0
    pytest.param(0, [], id="empty"),  # an empty tensor
    pytest.param(300, list(range(300)), id="every-byte"),
]


def xor8_case(nbytes: int, at: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Random base bytes, and the same with the bytes `at` changed."""
    rng = np.random.default_rng(len(at) * 1000 + nbytes)
    base = rng.integers(0, 256, size=nbytes, dtype=np.uint8)
    changed = base.copy()
    for j in at:
        changed[j] ^= 1 + j % 255  # never 0
    return base, changed


def xor8_entries(at: list[int]) -> int:
    """The entries SPARSE_XOR8 takes for changes at `at`: one each, and a
    bridge per 255 bytes between two of them beyond the first 255."""
    return len(at) + sum((b - a - 1) // 255 for a, b in zip([-1, *at], at))
