"""The RPCs that change weights or caches: UpdateWeights, the staged update
(BeginUpdate, UploadChunks, GetUpdateStatus, CommitUpdate, AbortUpdate) and
ResetCaches. Receiving is update/transfers.py's, applying update/updates.py's."""

from __future__ import annotations

import os

from rollout.v1 import rollout_pb2 as pb
from rollout_service.handoff.region import SHM_DIR
from rollout_service.rpc.handlers import unary
from rollout_service.rpc.readiness import Serving


class UpdateRpcs:
    """The update RPCs over the App's weight transfers, updater and sleeper."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving
        self.ending = serving.ending

    @unary
    async def UpdateWeights(self, request_iterator, context):
        app = self.serving.ready.app
        return await app.transfers.update_stream(request_iterator)

    @unary
    async def BeginUpdate(self, request, context):
        transfers = self.serving.ready.app.transfers
        transfer = await transfers.begin(request.begin, same_host=request.same_host)
        plan = transfer.receiver.plan
        reply = pb.BeginUpdateResponse(
            update_id=transfer.id,
            total_bytes=plan.total_bytes,
            idle_timeout_seconds=transfers.idle_timeout_seconds,
        )
        if request.same_host:
            reply.shared_staging.path = os.path.join(SHM_DIR, plan.region.name)
            reply.shared_staging.tensor_offsets.extend(plan.tensor_offsets)
        return reply

    @unary
    async def UploadChunks(self, request_iterator, context):
        transfers = self.serving.ready.app.transfers
        received = 0
        transfer = None
        async for msg in request_iterator:
            if transfer is None or msg.update_id != transfer.id:
                transfer = transfers.get(msg.update_id)
            received += transfers.upload(transfer, msg)
        return pb.UploadChunksResponse(bytes_received=received)

    @unary
    async def GetUpdateStatus(self, request, context):
        transfers = self.serving.ready.app.transfers
        return transfers.status(transfers.get(request.update_id))

    @unary
    async def CommitUpdate(self, request, context):
        transfers = self.serving.ready.app.transfers
        return pb.CommitUpdateResponse(result=await transfers.commit(request.update_id))

    @unary
    async def AbortUpdate(self, request, context):
        transfers = self.serving.ready.app.transfers
        transfers.abort(transfers.get(request.update_id))
        return pb.AbortUpdateResponse()

    @unary
    async def ResetCaches(self, request, context):
        return await self.serving.ready.app.updater.reset_caches()

    @unary
    async def Sleep(self, request, context):
        return await self.serving.ready.app.sleeper.sleep(request.level)

    @unary
    async def WakeUp(self, request, context):
        return await self.serving.ready.app.sleeper.wake_up()
