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
from rollout_service.sessions import appends, resuming, trajectory
from rollout_service.sessions.opening import budget_of, open_prompt
from rollout_service.sessions.store import Session
from rollout_service.status.errors import InvalidArgument

_ISOLATED = pb.APPEND_RENDER_ISOLATED


def _open(session: Session, request: pb.OpenSessionRequest, limits, tok) -> list[int]:
    """On the tokenizing thread: the prompt (or the resumed history) into
    the new session."""
    if request.HasField("resume"):
        if request.prompt_token_ids or request.prompt_text or request.messages:
            raise InvalidArgument("resume", "re-opens a history: set no prompt field with it")
        return resuming.resume(session, request, limits, request.append_render != _ISOLATED)
    prompt = open_prompt(request, limits, tok, session.budget)
    session.trajectory.append(pb.TOKEN_SOURCE_PROMPT, prompt.ids)
    session.opened_with(prompt.conversation, request.append_render != _ISOLATED, prompt.text_bytes)
    session.tools = prompt.tools
    return prompt.ids


class SessionRpcs:
    """The session RPCs over one Serving; a turn runs through the pipeline
    (pipeline/session_turns.py)."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving
        self.ending = serving.ending

    @unary
    async def OpenSession(self, request, context):
        ready = self.serving.ready
        app = ready.app
        app.served.check_serving()
        if request.lora_adapter:
            app.adapters.check_known(request.lora_adapter)
        limits = app.info.limits
        budget = budget_of(request, limits)
        # Counted before any tokenizing: a caller at its limit costs nothing.
        session = app.session_store.new(
            ready.turns.ids.issue(),
            CALLER.get().owner,
            budget,
            lora_adapter=request.lora_adapter,
            pinned_version=app.served.version if request.pin_weight_version else "",
        )
        try:
            ids = await app.tokenizing.off_loop(_open, session, request, limits, app.tokenizing)
        except BaseException:
            app.session_store.release(session)
            raise
        app.session_store.add(session)
        return pb.OpenSessionResponse(
            session_id=session.id,
            prompt_token_ids=ids,
            weight_version=app.served.version,
            max_total_tokens=budget,
            idle_timeout_seconds=app.session_store.limits.idle_timeout_seconds,
        )

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
