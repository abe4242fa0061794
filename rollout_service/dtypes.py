"""The proto DType enum, its torch twins and byte sizes."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rollout.v1 import rollout_pb2 as pb

# Bytes per element, by proto DType.
ITEM_SIZE = {
    pb.D_TYPE_BFLOAT16: 2,
    pb.D_TYPE_FLOAT16: 2,
    pb.D_TYPE_FLOAT32: 4,
    pb.D_TYPE_FLOAT8_E4M3FN: 1,
    pb.D_TYPE_FLOAT8_E5M2: 1,
}

# The torch dtype's name (torch.<name>), by proto DType.
TORCH_NAME = {
    pb.D_TYPE_BFLOAT16: "bfloat16",
    pb.D_TYPE_FLOAT16: "float16",
    pb.D_TYPE_FLOAT32: "float32",
    pb.D_TYPE_FLOAT8_E4M3FN: "float8_e4m3fn",
    pb.D_TYPE_FLOAT8_E5M2: "float8_e5m2",
}
_BY_TORCH_NAME = {v: k for k, v in TORCH_NAME.items()}


def name(dtype: int) -> str:
    """'D_TYPE_BFLOAT16', or the number for values this build doesn't know."""
    return pb.DType.Name(dtype) if dtype in pb.DType.values() else str(dtype)


def from_torch(dtype) -> int:
    """The proto DType of a torch dtype; raises ValueError for others."""
    key = str(dtype).removeprefix("torch.")
    if key not in _BY_TORCH_NAME:
        raise ValueError(f"dtype {dtype} has no rollout.v1 DType")
    return _BY_TORCH_NAME[key]


def nbytes(dtype: int, shape: Sequence[int]) -> int:
    """Size in bytes of a tensor of that dtype and shape."""
    return ITEM_SIZE[dtype] * math.prod(shape)
