"""Turning what a trainer holds into an UpdateWeights stream.

Accepted sources: a `state_dict()`, `module.named_parameters()`, a path to a
safetensors file, or any iterable of `(name, tensor)`. Tensors may be torch
tensors or numpy arrays. The tensors are checked against the server's manifest
before a byte is sent.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_client import dtypes

DEFAULT_CHUNK_BYTES = 1 << 20


class ManifestMismatch(ValueError):
    """A tensor the server would refuse (unknown name, wrong dtype or shape)."""


@dataclass
class PreparedTensor:
    """A tensor's spec and a read-only view of its bytes."""

    spec: pb.TensorSpec
    data: memoryview

    @property
    def nbytes(self) -> int:
        return len(self.data)


def _as_bytes(t: Any) -> memoryview:
    """Row-major bytes of a torch tensor or numpy array, without a copy when
    it is already contiguous on the CPU."""
    if hasattr(t, "detach"):  # torch
        import torch

        t = t.detach()
        if getattr(t, "full_tensor", None):  # FSDP DTensor
            t = t.full_tensor()
        # reshape first: a 0-d tensor cannot be viewed as bytes directly
        t = t.to("cpu").contiguous().reshape(-1)
        return memoryview(t.view(torch.uint8).numpy()).cast("B")
    import numpy as np

    return memoryview(np.ascontiguousarray(t)).cast("B")


def iter_named_tensors(source: Any) -> Iterator[tuple[str, Any]]:
    """Normalises every supported weight source to `(name, tensor)` pairs."""
    if isinstance(source, (str, os.PathLike)):
        from safetensors.torch import load_file

        yield from load_file(os.fspath(source)).items()
    elif isinstance(source, Mapping):
        yield from source.items()
    elif hasattr(source, "named_parameters"):
        yield from source.named_parameters()
    else:
        yield from source


def prepare_tensors(
    source: Any,
    manifest: Iterable[pb.TensorSpec] | None = None,
    checksum: bool = False,
) -> list[PreparedTensor]:
    """Reads the source and checks every tensor against the manifest (when
    given), so that a wrong name or shape fails before anything is sent."""
    expected = {s.name: s for s in manifest} if manifest is not None else None
    prepared = []
    for name, tensor in iter_named_tensors(source):
        dtype = dtypes.from_torch(tensor.dtype)
        if dtype is None:
            raise ManifestMismatch(f"{name}: dtype {tensor.dtype} is not supported")
        shape = [int(d) for d in tensor.shape]
        if expected is not None:
            want = expected.get(name)
            if want is None:
                raise ManifestMismatch(f"{name}: not a parameter of the served model")
            if want.dtype != dtype:
                raise ManifestMismatch(
                    f"{name}: dtype {pb.DType.Name(dtype)}, the server takes "
                    f"{pb.DType.Name(want.dtype)}"
                )
            if list(want.shape) != shape:
                raise ManifestMismatch(
                    f"{name}: shape {shape}, the server takes {list(want.shape)}"
                )
        data = _as_bytes(tensor)
        spec = pb.TensorSpec(name=name, dtype=dtype, shape=shape)
        if checksum:
            import crc32c

            spec.crc32c = crc32c.crc32c(data)
        prepared.append(PreparedTensor(spec=spec, data=data))
    if not prepared:
        raise ValueError("the weight source holds no tensors")
    return prepared


def iter_update_requests(
    tensors: list[PreparedTensor],
    weight_version: str,
    pause_mode: int = pb.PAUSE_MODE_WAIT,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress=None,
    drain_timeout_seconds: float | None = None,
) -> Iterator[pb.UpdateWeightsRequest]:
    """begin, the chunks of every tensor in order, commit. `progress` (a
    tqdm-like object) is advanced by the bytes of each chunk sent."""
    begin = pb.UpdateWeightsBegin(
        weight_version=weight_version,
        tensors=[t.spec for t in tensors],
        pause_mode=pause_mode,
    )
    if drain_timeout_seconds is not None:
        begin.drain_timeout_seconds = drain_timeout_seconds
    yield pb.UpdateWeightsRequest(begin=begin)
    for index, t in enumerate(tensors):
        for offset in range(0, t.nbytes, chunk_bytes):
            piece = t.data[offset : offset + chunk_bytes]
            yield pb.UpdateWeightsRequest(
                chunk=pb.TensorChunk(tensor_index=index, offset=offset, data=piece.tobytes())
            )
            if progress is not None:
                progress.update(len(piece))
    yield pb.UpdateWeightsRequest(commit=pb.UpdateWeightsCommit())
