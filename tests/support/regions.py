"""A staging region in plain memory, for the assembler's engine-free tests."""

from __future__ import annotations


class FakeRegion:
    """The region's contract: the same buffer while it is big enough."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def ensure(self, nbytes: int) -> memoryview:
        if len(self.buf) < nbytes:
            self.buf = bytearray(nbytes)
        return memoryview(self.buf)
