"""Weight sources read lazily, one tensor at a time.

An update is described (names, dtypes, shapes, sizes) before any tensor byte
is read: from the safetensors headers of a file, or from tensor metadata.
Bytes are then read tensor by tensor, chunk by chunk, as they are sent, so
the client holds about one tensor plus the messages in flight, whatever the
model's size, and the first byte leaves before the model is read.

Accepted: a path to a safetensors file, or to a folder of them (a sharded
checkpoint); a `state_dict()` or any mapping; a module (`named_parameters()`);
any iterable of `(name, tensor)`. Tensors may be torch tensors (on any device,
FSDP DTensors included: each is gathered when its turn comes) or numpy arrays.
"""

from __future__ import annotations

import glob
import json
import os
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_codecs import dtypes, extras


@dataclass
class SourceTensor:
    """One tensor of a source: its description, and its bytes on demand."""

    name: str
    dtype: pb.DType
    shape: list[int]
    nbytes: int
    # Returns bytes [offset, offset + size) (a view where it can).
    read: Callable[[int, int], bytes | memoryview]
    # Reads bytes [offset, offset + len(buf)) into `buf` (a writable view).
    read_into: Callable[[int, memoryview], None]
    # Called when the tensor has been sent, to drop what `read` holds.
    release: Callable[[], None] = lambda: None

    def chunks(self, chunk_bytes: int) -> Iterator[tuple[int, bytes | memoryview]]:
        """(offset, bytes-like) pieces of the tensor, in order."""
        try:
            for offset in range(0, self.nbytes, chunk_bytes):
                yield offset, self.read(offset, min(chunk_bytes, self.nbytes - offset))
        finally:
            self.release()


def open_source(source: Any) -> list[SourceTensor]:
    """The tensors of a weight source, described; no tensor bytes read yet
    (for in-memory tensors, nothing is copied or gathered yet either)."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        files = (
            sorted(glob.glob(os.path.join(path, "*.safetensors")))
            if os.path.isdir(path)
            else [path]
        )
        if not files:
            raise ValueError(f"{path}: no .safetensors files")
        return [t for f in files for t in _safetensors_file(f)]
    if isinstance(source, Mapping):
        items = source.items()
    elif hasattr(source, "named_parameters"):
        items = source.named_parameters()
    else:
        items = source
    return [_in_memory(name, t) for name, t in items]


_HEADER = struct.Struct("<Q")


class _File:
    """An open file, closed when the last tensor reading from it is gone."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY)

    def read(self, offset: int, size: int) -> bytes:
        return os.pread(self.fd, size, offset)

    def read_into(self, offset: int, buf: memoryview) -> None:
        while len(buf):
            n = os.preadv(self.fd, [buf], offset)
            if n <= 0:
                raise OSError(f"short read at offset {offset}")
            buf, offset = buf[n:], offset + n

    def __del__(self) -> None:
        os.close(self.fd)


def _safetensors_file(path: str) -> list[SourceTensor]:
    """A safetensors file's tensors, from its header; bytes by pread (no
    mapping of the file: its page cache is not charged to this process)."""
    f = _File(path)
    (header_len,) = _HEADER.unpack(f.read(0, 8))
    header = json.loads(f.read(8, header_len))
    base = 8 + header_len
    return [
        _file_tensor(f, name, meta, base) for name, meta in header.items() if name != "__metadata__"
    ]


def _file_tensor(f: _File, name: str, meta: dict[str, Any], base: int) -> SourceTensor:
    """One tensor of a safetensors file, from its header entry; its data
    starts `base` bytes into the file (after the header)."""
    start, end = meta["data_offsets"]
    at = base + start
    return SourceTensor(
        name=name,
        dtype=dtypes.from_safetensors(meta["dtype"]),
        shape=[int(d) for d in meta["shape"]],
        nbytes=end - start,
        read=lambda off, n: f.read(at + off, n),
        read_into=lambda off, buf: f.read_into(at + off, buf),
    )


def _in_memory(name: str, tensor: Any) -> SourceTensor:
    """A torch tensor or numpy array: made into contiguous CPU bytes when
    its turn comes (gathered, for a DTensor), and let go after it."""
    dtype = dtypes.from_torch(tensor.dtype)
    if dtype is None:
        raise ValueError(f"{name}: dtype {tensor.dtype} is not supported")
    shape = [int(d) for d in tensor.shape]
    held: list[memoryview] = []

    def data() -> memoryview:
        if not held:
            held.append(_as_bytes(tensor))
        return held[0]

    return SourceTensor(
        name=name,
        dtype=dtype,
        shape=shape,
        nbytes=dtypes.nbytes(dtype, shape),
        read=lambda off, n: data()[off : off + n],
        read_into=lambda off, buf: buf.__setitem__(slice(None), data()[off : off + len(buf)]),
        release=held.clear,
    )


def _as_bytes(t: Any) -> memoryview:
    """Row-major bytes of a torch tensor or numpy array, without a copy when
    it is already contiguous on the CPU."""
    # numpy gives both kinds their byte view; torch is there if `t` is a tensor
    np = extras.require("numpy", "pushing in-memory tensors")
    if hasattr(t, "detach"):  # torch
        import torch

        t = t.detach()
        if getattr(t, "full_tensor", None):  # FSDP DTensor
            t = t.full_tensor()
        # reshape first: a 0-d tensor cannot be viewed as bytes directly
        t = t.to("cpu").contiguous().reshape(-1)
        return memoryview(t.view(torch.uint8).numpy()).cast("B")
    return memoryview(np.ascontiguousarray(t)).cast("B")
