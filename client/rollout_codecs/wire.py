"""Tensor chunks in protobuf's wire format, without a protobuf message.

A chunk message is a few varints around a large `bytes` field. Built or
parsed through protobuf, its data is copied once more than needed: into the
message on the way in, out of it on the way out. These functions write the
few header bytes by hand and join them with the data in one copy (sender),
or find the data inside the received bytes and hand out a zero-copy view of
it (receiver). Anything but a plain chunk message is left to protobuf.

The layouts (rollout.proto):
    UpdateWeightsRequest  { oneof kind { begin = 1; TensorChunk chunk = 2; commit = 3; } }
    UploadChunksRequest   { string update_id = 1; TensorChunk chunk = 2; }
    TensorChunk           { uint32 tensor_index = 1; uint64 offset = 2; bytes data = 3; }
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

_VARINT, _LEN = 0, 2


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _tag(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _chunk_header(tensor_index: int, offset: int, size: int) -> bytes:
    """TensorChunk's bytes up to (not including) its data."""
    head = b""
    if tensor_index:  # proto3: zero values are not written
        head += _tag(1, _VARINT) + _varint(tensor_index)
    if offset:
        head += _tag(2, _VARINT) + _varint(offset)
    return head + _tag(3, _LEN) + _varint(size)


def _wrap(field: int, inner_header: bytes, size: int, prefix: bytes = b"") -> bytes:
    """The header of a message whose field `field` is a TensorChunk."""
    return prefix + _tag(field, _LEN) + _varint(len(inner_header) + size) + inner_header


def update_weights_chunk(
    tensor_index: int, offset: int, data: bytes | bytearray | memoryview
) -> bytes:
    """A serialized UpdateWeightsRequest{chunk}; `data` is any bytes-like."""
    n = len(data)
    return b"".join((_wrap(2, _chunk_header(tensor_index, offset, n), n), data))


def upload_chunk(
    update_id: str, tensor_index: int, offset: int, data: bytes | bytearray | memoryview
) -> bytes:
    """A serialized UploadChunksRequest."""
    n = len(data)
    uid = update_id.encode()
    prefix = _tag(1, _LEN) + _varint(len(uid)) + uid
    return b"".join((_wrap(2, _chunk_header(tensor_index, offset, n), n, prefix), data))


@dataclass(frozen=True)
class RawChunk:
    """A parsed chunk: `data` is a view of the received message's bytes."""

    tensor_index: int
    offset: int
    data: memoryview
    update_id: str = ""


class NotAChunk(Exception):
    """The bytes are not a plain chunk message: parse them with protobuf."""


def _read_varint(buf: memoryview, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise NotAChunk("truncated or overlong varint")
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, i
        shift += 7


def _fields(buf: memoryview) -> Iterator[tuple[int, int | memoryview]]:
    """(field number, value) of every field; varints as ints, LEN as views.
    Other wire types are not used by chunk messages: NotAChunk."""
    i = 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        field, wire_type = key >> 3, key & 7
        value: int | memoryview
        if wire_type == _VARINT:
            value, i = _read_varint(buf, i)
        elif wire_type == _LEN:
            size, i = _read_varint(buf, i)
            if i + size > len(buf):
                raise NotAChunk("truncated field")
            value, i = buf[i : i + size], i + size
        else:
            raise NotAChunk(f"wire type {wire_type}")
        yield field, value


def _parse_chunk(buf: memoryview, update_id: str = "") -> RawChunk:
    index = offset = 0
    data = memoryview(b"")
    seen = set()
    for field, value in _fields(buf):
        if field in seen:
            raise NotAChunk(f"TensorChunk field {field} twice")
        seen.add(field)
        if field == 1 and isinstance(value, int):
            index = value
        elif field == 2 and isinstance(value, int):
            offset = value
        elif field == 3 and isinstance(value, memoryview):
            data = value
        else:
            raise NotAChunk(f"TensorChunk field {field}")
    if index >= 1 << 32:
        raise NotAChunk("tensor_index out of uint32 range")
    return RawChunk(tensor_index=index, offset=offset, data=data, update_id=update_id)


def parse_update_weights_chunk(raw: bytes) -> RawChunk:
    """An UpdateWeightsRequest whose only field is `chunk`; NotAChunk else."""
    fields = list(_fields(memoryview(raw)))
    if len(fields) != 1 or fields[0][0] != 2 or not isinstance(fields[0][1], memoryview):
        raise NotAChunk("not a chunk message")
    return _parse_chunk(fields[0][1])


def parse_upload_chunk(raw: bytes) -> RawChunk:
    """An UploadChunksRequest; NotAChunk for anything unexpected."""
    update_id, chunk, seen = "", None, set()
    for field, value in _fields(memoryview(raw)):
        if field in seen:  # protobuf would merge or override: leave it to protobuf
            raise NotAChunk(f"UploadChunksRequest field {field} twice")
        seen.add(field)
        if field == 1 and isinstance(value, memoryview):
            try:
                update_id = bytes(value).decode()
            except UnicodeDecodeError as e:
                raise NotAChunk("update_id is not UTF-8") from e
        elif field == 2 and isinstance(value, memoryview):
            chunk = value
        else:
            raise NotAChunk(f"UploadChunksRequest field {field}")
    return _parse_chunk(chunk if chunk is not None else memoryview(b""), update_id)
