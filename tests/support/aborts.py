"""What the error policy's abort() sends, recorded on a stand-in for a
grpc.aio servicer context."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.rpc import status_pb2

from rollout_service.rpc.statuses import abort


class Context:
    """Records what the policy aborts with; aborting raises, as in grpc.aio."""

    def __init__(self) -> None:
        self.aborted = None

    async def abort(self, code, details, trailing_metadata=()):
        self.aborted = (code, details, dict(trailing_metadata))
        raise grpc.aio.AbortError()


def aborted(error: Exception, rpc: str = "Generate"):
    context = Context()
    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(abort(context, error, rpc))
    code, details, trailers = context.aborted
    status = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    assert (status.code, status.message) == (code.value[0], details)
    return code, details, status
