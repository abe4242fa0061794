"""The RPCs that change weights or caches: UpdateWeights, the staged update
(BeginUpdate, UploadChunks, GetUpdateStatus, CommitUpdate, AbortUpdate) and
ResetCaches. Receiving is update/sessions.py's, applying update/updates.py's."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from rollout.v1 import rollout_pb2 as pb
from rollout_service.handoff.region import SHM_DIR
from rollout_service.rpc.handlers import unary
from rollout_service.update.sessions import UpdateSessions
from rollout_service.update.sleep import Sleeper

if TYPE_CHECKING:
    from rollout_service.engine.protocol import Engine


class UpdateRpcs:
    """Mixed into RolloutServicer; `self.sessions` is set on attach."""

    sessions: UpdateSessions
    sleeper: Sleeper

    def _check_ready(self) -> Engine:  # RolloutServicer's
        raise NotImplementedError

    @unary
    async def UpdateWeights(self, request_iterator, context):
        self._check_ready()
        return await self.sessions.update_stream(request_iterator)

    @unary
    async def BeginUpdate(self, request, context):
        self._check_ready()
        session = await self.sessions.begin(request.begin, same_host=request.same_host)
        plan = session.receiver.plan
        reply = pb.BeginUpdateResponse(
            update_id=session.id,
            total_bytes=plan.total_bytes,
            idle_timeout_seconds=self.sessions.idle_timeout_seconds,
        )
        if request.same_host:
            reply.shared_staging.path = os.path.join(SHM_DIR, plan.region.name)
            reply.shared_staging.tensor_offsets.extend(plan.tensor_offsets)
        return reply

    @unary
    async def UploadChunks(self, request_iterator, context):
        self._check_ready()
        received = 0
        session = None
        async for msg in request_iterator:
            if session is None or msg.update_id != session.id:
                session = self.sessions.get(msg.update_id)
            received += self.sessions.upload(session, msg)
        return pb.UploadChunksResponse(bytes_received=received)

    @unary
    async def GetUpdateStatus(self, request, context):
        self._check_ready()
        return self.sessions.status(self.sessions.get(request.update_id))

    @unary
    async def CommitUpdate(self, request, context):
        self._check_ready()
        return pb.CommitUpdateResponse(result=await self.sessions.commit(request.update_id))

    @unary
    async def AbortUpdate(self, request, context):
        self._check_ready()
        self.sessions.abort(self.sessions.get(request.update_id))
        return pb.AbortUpdateResponse()

    @unary
    async def ResetCaches(self, request, context):
        self._check_ready()
        return await self.sessions.updater.reset_caches()

    @unary
    async def Sleep(self, request, context):
        self._check_ready()
        return await self.sleeper.sleep(request.level)

    @unary
    async def WakeUp(self, request, context):
        self._check_ready()
        return await self.sleeper.wake_up()
