"""The session RPCs: OpenSession, SessionGenerate(Stream), AppendToSession,
GetSession, CloseSession. Adapters over sessions/: the ids say whose an id
is (session_ids.py), the store finds the caller's session, the tokenizing
thread plans and renders, a turn runs through the same gate, engine request
and Abort registry as Generate."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.fairness.identity import caller_id
from rollout_service.ops.auth import CALLER
from rollout_service.rpc.handlers import streaming, unary
from rollout_service.sessions import appends, resuming, trajectory
from rollout_service.sessions.opening import budget_of, open_prompt
from rollout_service.sessions.store import Session, SessionStore
from rollout_service.status.errors import InvalidArgument

if TYPE_CHECKING:
    from rollout_service.engine.gate import AdmissionGate
    from rollout_service.engine.protocol import Engine
    from rollout_service.engine.startup import EngineInfo
    from rollout_service.generation.tokenizing import Tokenizing
    from rollout_service.pipeline.session_turns import SessionTurns
    from rollout_service.update.lora import Adapters
    from rollout_service.update.updates import WeightUpdater

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
    """Mixed into RolloutServicer, which sets these (config when built, the
    rest on attach); a turn runs through the pipeline (session_turns)."""

    config: Any  # the ServerConfig (config.py is a layer above rpc/)
    session_store: SessionStore
    tok: Tokenizing
    info: EngineInfo
    gate: AdmissionGate
    updater: WeightUpdater
    adapters: Adapters
    session_turns: SessionTurns

    def _check_ready(self) -> Engine:
        raise NotImplementedError

    def _session(self, session_id: str) -> Session:
        return self.session_turns.find(session_id)

    @unary
    async def OpenSession(self, request, context):
        self._check_ready()
        self.updater.check_serving()
        if request.lora_adapter:
            self.adapters.check_known(request.lora_adapter)
        limits = self.info.limits
        budget = budget_of(request, limits)
        # Counted before any tokenizing: a caller at its limit costs nothing.
        session = self.session_store.new(
            self.session_turns.ids.issue(),
            CALLER.get().owner,
            budget,
            lora_adapter=request.lora_adapter,
            pinned_version=self.gate.version if request.pin_weight_version else "",
        )
        try:
            ids = await self.tok.off_loop(_open, session, request, limits, self.tok)
        except BaseException:
            self.session_store.release(session)
            raise
        self.session_store.add(session)
        return pb.OpenSessionResponse(
            session_id=session.id,
            prompt_token_ids=ids,
            weight_version=self.gate.version,
            max_total_tokens=budget,
            idle_timeout_seconds=self.session_store.limits.idle_timeout_seconds,
        )

    @unary
    async def SessionGenerate(self, request, context):
        self._check_ready()
        return await self.session_turns.generate(request, caller_id(context))

    @streaming
    def SessionGenerateStream(self, request, context):
        self._check_ready()
        return self.session_turns.stream(request, caller_id(context))

    @unary
    async def AppendToSession(self, request, context):
        self._check_ready()
        session = self._session(request.session_id)
        with self.session_store.using(session):
            ids = await self.tok.off_loop(
                appends.append, session, request, self.info.limits, self.tok
            )
        return pb.AppendToSessionResponse(
            token_ids=ids, total_tokens=len(session.trajectory), budget_remaining=session.remaining
        )

    @unary
    async def GetSession(self, request, context):
        self._check_ready()
        session = self._session(request.session_id)
        t = session.trajectory
        if request.from_segment > len(t.segments):
            n = len(t.segments)
            raise InvalidArgument("from_segment", f"{request.from_segment}: past its {n} segments")
        response, first = trajectory.snapshot(t, request.from_segment)
        response = await self.tok.off_loop(trajectory.tokens_to_proto, t, first, len(t), response)
        response.session_id = session.id
        response.max_total_tokens = session.budget
        response.pinned_weight_version = session.pinned_version
        response.busy = session.busy
        response.resumed_tokens = session.resumed_tokens
        return response

    @unary
    async def CloseSession(self, request, context):
        self._check_ready()
        session = self._session(request.session_id)
        self.session_store.close(session)
        if abort := session.abort_turn:
            await abort()
        return pb.CloseSessionResponse(aborted_turn=abort is not None)
