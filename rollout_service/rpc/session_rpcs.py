"""The session RPCs: OpenSession, SessionGenerate(Stream), AppendToSession,
GetSession, CloseSession. Adapters over sessions/: the ids say whose an id
is (session_ids.py), the store finds the caller's session, the tokenizing
thread renders; a turn runs through the pipeline (pipeline/session_turns.py),
the same slot, gate, engine request and Abort registry as Generate."""

from __future__ import annotations

from rollout.v1 import rollout_pb2 as pb
from rollout_service.fairness.identity import caller_id
from rollout_service.ops.auth import CALLER
from rollout_service.rpc.handlers import streaming, unary
from rollout_service.rpc.readiness import Serving
from rollout_service.sessions import appends, trajectory
from rollout_service.sessions.open_call import open_session
from rollout_service.status.errors import InvalidArgument


class SessionRpcs:
    """The session RPCs over one Serving; a turn runs through the pipeline
    (pipeline/session_turns.py)."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving
        self.ending = serving.ending

    @unary
    async def OpenSession(self, request, context):
        ready = self.serving.ready
        owner = CALLER.get().owner
        _, response = await open_session(ready.app, ready.turns.ids.issue(), owner, request)
        if root := self.serving.http_url:
            response.base_url = f"{root}/sessions/{response.session_id}/v1"
        return response

    @unary
    async def SessionGenerate(self, request, context):
        return await self.serving.ready.turns.generate(request, caller_id(context))

    @streaming
    def SessionGenerateStream(self, request, context):
        return self.serving.ready.turns.stream(request, caller_id(context))

    @unary
    async def AppendToSession(self, request, context):
        ready = self.serving.ready
        app = ready.app
        session = ready.turns.find(request.session_id)
        with app.session_store.using(session):
            ids = await app.tokenizing.off_loop(
                appends.append, session, request, app.info.limits, app.tokenizing
            )
        return pb.AppendToSessionResponse(
            token_ids=ids, total_tokens=len(session.trajectory), budget_remaining=session.remaining
        )

    @unary
    async def GetSession(self, request, context):
        ready = self.serving.ready
        session = ready.turns.find(request.session_id)
        t = session.trajectory
        if request.from_segment > len(t.segments):
            n = len(t.segments)
            raise InvalidArgument("from_segment", f"{request.from_segment}: past its {n} segments")
        response, first = trajectory.snapshot(t, request.from_segment)
        tok = ready.app.tokenizing
        response = await tok.off_loop(trajectory.tokens_to_proto, t, first, len(t), response)
        if request.include_messages:
            k = request.from_segment
            segments = t.segments[k : k + len(response.segments)]
            await tok.off_loop(trajectory.messages_to_proto, segments, response)
        response.session_id = session.id
        response.max_total_tokens = session.budget
        response.pinned_weight_version = session.pinned_version
        response.busy = session.busy
        response.resumed_tokens = session.resumed_tokens
        return response

    @unary
    async def CloseSession(self, request, context):
        ready = self.serving.ready
        session = ready.turns.find(request.session_id)
        ready.app.session_store.close(session)
        if abort := session.abort_turn:
            await abort()
        return pb.CloseSessionResponse(aborted_turn=abort is not None)
