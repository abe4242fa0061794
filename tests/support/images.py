"""Image bytes for the image limits' tests (HTTP and gRPC alike)."""

from __future__ import annotations

import struct
import zlib


def png_of(width: int, height: int, rows: bytes | None = None) -> bytes:
    """A grayscale PNG of `width` x `height` whose chunks are whole and
    checksummed (PIL's verify passes) but whose pixel data is `rows` (none:
    empty): what a header promises, at no cost to make."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(rows or b"")
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
