"""The one table of tensor element types: the proto DType, its torch name,
its safetensors name and its size. The server imports it too."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from rollout.v1 import rollout_pb2 as pb


class DTypeInfo(NamedTuple):
    torch_name: str  # torch.<name>, numpy's name where numpy has the type
    safetensors_name: str  # as in safetensors headers
    itemsize: int


TABLE: dict[pb.DType, DTypeInfo] = {
    pb.D_TYPE_BFLOAT16: DTypeInfo("bfloat16", "BF16", 2),
    pb.D_TYPE_FLOAT16: DTypeInfo("float16", "F16", 2),
    pb.D_TYPE_FLOAT32: DTypeInfo("float32", "F32", 4),
    pb.D_TYPE_FLOAT64: DTypeInfo("float64", "F64", 8),
    pb.D_TYPE_FLOAT8_E4M3FN: DTypeInfo("float8_e4m3fn", "F8_E4M3", 1),
    pb.D_TYPE_FLOAT8_E5M2: DTypeInfo("float8_e5m2", "F8_E5M2", 1),
    pb.D_TYPE_INT8: DTypeInfo("int8", "I8", 1),
    pb.D_TYPE_UINT8: DTypeInfo("uint8", "U8", 1),
    pb.D_TYPE_INT16: DTypeInfo("int16", "I16", 2),
    pb.D_TYPE_INT32: DTypeInfo("int32", "I32", 4),
    pb.D_TYPE_INT64: DTypeInfo("int64", "I64", 8),
    pb.D_TYPE_BOOL: DTypeInfo("bool", "BOOL", 1),
}
_BY_TORCH = {v.torch_name: k for k, v in TABLE.items()}
_BY_SAFETENSORS = {v.safetensors_name: k for k, v in TABLE.items()}


def name(dtype: int) -> str:
    """'D_TYPE_BFLOAT16', or the number for values this build doesn't know."""
    return pb.DType.Name(dtype) if dtype in pb.DType.values() else str(dtype)


def from_torch(dtype: object) -> pb.DType | None:
    """The proto DType of a torch (or numpy) dtype, None for others."""
    return _BY_TORCH.get(str(dtype).removeprefix("torch."))


def from_safetensors(dtype: str) -> pb.DType:
    """The proto DType of a safetensors header dtype; ValueError for others."""
    if dtype not in _BY_SAFETENSORS:
        raise ValueError(f"safetensors dtype {dtype} has no rollout.v1 DType")
    return _BY_SAFETENSORS[dtype]


def torch_name(dtype: pb.DType) -> str:
    return TABLE[dtype].torch_name


def nbytes(dtype: pb.DType, shape: Sequence[int]) -> int:
    """Size in bytes of a tensor of that dtype and shape."""
    return TABLE[dtype].itemsize * math.prod(shape)
