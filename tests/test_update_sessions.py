"""The open-update bookkeeping alone (no engine): idle expiry, one at a
time, a stalled UpdateWeights stream."""

from __future__ import annotations

import asyncio

import pytest

from rollout.v1 import rollout_pb2 as pb
from rollout_service.errors import Aborted, DeadlineExceeded, FailedPrecondition
from rollout_service.update.assembler import UpdateAssembler
from rollout_service.update.sessions import UpdateSessions

SPEC = pb.TensorSpec(name="a", dtype=pb.D_TYPE_BFLOAT16, shape=[4])
BEGIN = pb.UpdateWeightsBegin(weight_version="v1", tensors=[SPEC])


class _Staging:
    def ensure(self, nbytes):
        return memoryview(bytearray(max(nbytes, 1)))


class _Updater:
    async def assembler(self, begin=None):
        return UpdateAssembler({"a": SPEC}, 1 << 20, _Staging(), "v0")


def test_an_idle_update_expires_and_frees_the_region():
    async def main():
        sessions = UpdateSessions(_Updater(), idle_timeout_seconds=1.0)
        s = await sessions.begin(BEGIN)
        with pytest.raises(Aborted):
            await sessions.begin(BEGIN)
        for _ in range(3):  # 1.5 s in all, but never 1 s without a call naming it
            await asyncio.sleep(0.5)
            assert sessions.get(s.id) is s
        await asyncio.sleep(2.0)
        with pytest.raises(FailedPrecondition, match="expired"):
            sessions.get(s.id)
        await sessions.begin(BEGIN)  # the region is free again

    asyncio.run(main())


def test_a_stalled_stream_is_cut_after_the_idle_timeout():
    async def main():
        sessions = UpdateSessions(_Updater(), idle_timeout_seconds=0.2)

        async def stalled():
            yield pb.UpdateWeightsRequest(begin=BEGIN)
            await asyncio.sleep(10)

        with pytest.raises(DeadlineExceeded, match="no message"):
            await sessions.update_stream(stalled())
        await sessions.begin(BEGIN)  # nothing left open

    asyncio.run(main())
