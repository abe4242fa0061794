"""A staging region in plain memory, for the update chain's engine-free tests."""

from __future__ import annotations


class FakeRegion:
    """The region's contract: the same buffer while it is big enough."""

    def __init__(self) -> None:
        self.buf = bytearray()

    @property
    def size(self) -> int:
        return len(self.buf)

    def ensure(self, nbytes: int, prefault: bool = False, room: int = 0) -> memoryview:
        if len(self.buf) < nbytes:
            self.buf = bytearray(nbytes + room)
        return memoryview(self.buf)
