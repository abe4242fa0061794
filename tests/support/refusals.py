"""A call the server refuses: its status code checked, its details returned."""

from __future__ import annotations

import grpc
import pytest


def refused(call, code=grpc.StatusCode.INVALID_ARGUMENT) -> str:
    with pytest.raises(grpc.RpcError) as e:
        call()
    assert e.value.code() == code, e.value.details()
    return e.value.details()
