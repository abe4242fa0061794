"""The session RPCs: OpenSession, SessionGenerate(Stream), AppendToSession,
GetSession, CloseSession. Adapters over sessions/: the ids say whose an id
is (session_ids.py), the store finds the caller's session, the tokenizing
thread plans and renders, a turn runs through the same gate, engine request
and Abort registry as Generate."""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.fairness.identity import CallerId, caller_id
from rollout_service.generation.convert import EnginePrompt
from rollout_service.generation.outputs import stream_delta_to_proto
from rollout_service.ops import logs
from rollout_service.ops.auth import CALLER
from rollout_service.rpc.handlers import streaming, unary
from rollout_service.sessions import appends, resuming, trajectory, turns
from rollout_service.sessions.opening import budget_of, open_prompt
from rollout_service.sessions.session_ids import SessionIds
from rollout_service.sessions.store import Session, SessionStore
from rollout_service.status.errors import FailedPrecondition, InvalidArgument

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from rollout_service.engine.gate import AdmissionGate, Ticket
    from rollout_service.engine.protocol import Engine
    from rollout_service.engine.startup import EngineInfo
    from rollout_service.fairness.share import FairShare, Slot
    from rollout_service.generation.tokenizing import Tokenizing
    from rollout_service.pipeline.calls import RunningCalls
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
    rest on attach) and defines the generation steps a turn shares with
    Generate."""

    config: Any  # the ServerConfig (config.py is a layer above rpc/)
    session_store: SessionStore
    tok: Tokenizing
    info: EngineInfo
    gate: AdmissionGate
    updater: WeightUpdater
    adapters: Adapters
    calls: RunningCalls
    fair: FairShare

    def _check_ready(self) -> Engine:
        raise NotImplementedError

    def _admitted(
        self, slot: Slot, call, required_version: str = ""
    ) -> AbstractAsyncContextManager[Ticket]:
        raise NotImplementedError

    def _run(
        self, ticket: Ticket, call, prompt, params, adapter: str, slot: Slot
    ) -> AsyncIterator[Any]:
        raise NotImplementedError

    def _delta_spans(self, ticket: Ticket, c, start: int, count: int) -> list[tuple[str, int, int]]:
        raise NotImplementedError

    @functools.cached_property
    def session_ids(self) -> SessionIds:
        """This run's session ids, named for the address it listens on
        (session_ids.py says why that, and not a random name)."""
        return SessionIds.listening(self.config)

    def _session(self, session_id: str) -> Session:
        """The caller's open session `session_id`; NOT_FOUND saying why not
        (not an id of this server's, another server's, lost in a restart,
        closed, expired), PERMISSION_DENIED for another caller's."""
        self.session_ids.check(session_id)
        return self.session_store.get(session_id, CALLER.get())

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
            self.session_ids.issue(),
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

    async def _turn(
        self, request, stream: pb.StreamOptions | None, result: dict[str, Any], who: CallerId
    ) -> AsyncIterator[tuple[pb.GenerateStreamResponse, pb.SessionState | None]]:
        """Runs one turn, counted against its caller as a generation
        (fairness/); yields each delta (with the session's state on the one
        that finishes it) and leaves the outcome in `result`."""
        self._check_ready()
        with self.fair.slot(who) as slot:
            async for step in self._turn_in(request, stream, result, slot):
                yield step

    async def _turn_in(
        self, request, stream: pb.StreamOptions | None, result: dict[str, Any], slot: Slot
    ) -> AsyncIterator[tuple[pb.GenerateStreamResponse, pb.SessionState | None]]:
        engine = self._check_ready()
        self.updater.check_serving()
        session = self._session(request.session_id)
        request_id = result["request_id"] = request.request_id or uuid.uuid4().hex
        logs.request_id.set(request_id)
        with self.session_store.using(session):
            plan = await self.tok.off_loop(
                turns.plan_turn,
                session,
                request.sampling_params,
                self.info.limits,
                self.tok,
                stream or pb.StreamOptions(omit_text=True),
            )
            result["plan"] = plan
            out = result["out"] = turns.TurnOutput()
            top_k = plan.params.logprobs or 0
            prompt = EnginePrompt({"prompt_token_ids": plan.prompt_ids}, len(plan.prompt_ids))
            omit_text = stream.omit_text if stream is not None else True
            with self.calls.running(request_id) as call:

                async def abort_turn() -> None:
                    call.aborted = True
                    if call.engine_id is not None:
                        await engine.abort([call.engine_id])

                session.abort_turn = abort_turn
                committed = False
                try:
                    async with self._admitted(slot, call, _required(request, session)) as ticket:
                        result["ticket"] = ticket
                        async for o in self._run(
                            ticket, call, prompt, plan.params, session.lora_adapter, slot
                        ):
                            out.cached_prompt_tokens = max(
                                out.cached_prompt_tokens, o.num_cached_tokens or 0
                            )
                            deltas = [
                                self._turn_delta(ticket, c, out, request_id, top_k, omit_text)
                                for c in o.outputs
                                if c.token_ids or c.finish_reason
                            ]
                            state = None
                            if o.finished:
                                slot.count(len(plan.prompt_ids), len(out.ids))
                                committed = True
                                seg = turns.commit(session, plan, out, ticket.adapter_version)
                                state = turns.state(session, plan, seg)
                            for i, d in enumerate(deltas):
                                yield d, state if i == len(deltas) - 1 else None
                        if not committed:  # aborted before it reached the engine
                            committed = True
                            yield _aborted(request_id, ticket), turns.state(session, plan, None)
                finally:
                    session.abort_turn = None
                    if not committed and "ticket" in result:
                        # Cancelled mid-turn: what it sampled stays, interrupted.
                        turns.commit(session, plan, out, result["ticket"].adapter_version)

    def _turn_delta(
        self, ticket: Ticket, c, out: turns.TurnOutput, request_id: str, top_k: int, omit: bool
    ) -> pb.GenerateStreamResponse:
        """One engine delta of a turn: gathered into `out`, and as a stream
        would send it."""
        spans = self._delta_spans(ticket, c, len(out.ids), len(c.token_ids))
        out.add(c, top_k, spans)
        return stream_delta_to_proto(
            request_id, c, top_k, ticket.version, spans, omit, ticket.adapter_version
        )

    @unary
    async def SessionGenerate(self, request, context):
        result: dict[str, Any] = {}
        state = None
        async for _, s in self._turn(request, None, result, caller_id(context)):
            state = s or state
        plan, out, ticket = result["plan"], result["out"], result["ticket"]
        completion = pb.Completion(
            token_ids=out.ids,
            logprobs=out.logprobs,
            finish_reason=out.final_reason(plan),
            top_logprobs=out.top,
            stop_reason=out.stop_reason,
        )
        for v, start, count in out.spans:
            completion.version_spans.add(weight_version=v, start=start, count=count)
        if out.ids and self.tok.tokenizer is not None:
            completion.text = await self.tok.off_loop(self.tok.decode, out.ids, True)
        return pb.SessionGenerateResponse(
            request_id=result["request_id"],
            completion=completion,
            weight_version=ticket.version,
            usage=_usage(plan, out),
            state=state,
            lora_adapter_version=ticket.adapter_version,
        )

    @streaming
    async def SessionGenerateStream(self, request, context):
        result: dict[str, Any] = {}
        options = request.stream_options
        async for delta, state in self._turn(request, options, result, caller_id(context)):
            if state is not None:
                plan, out = result["plan"], result["out"]
                delta.finish_reason = out.final_reason(plan)
                delta.usage.CopyFrom(_usage(plan, out))
            yield pb.SessionGenerateStreamResponse(delta=delta, state=state)

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


def _required(request, session: Session) -> str:
    """The version a turn must be admitted on: the session's pin, the
    turn's own, or both when they agree (refused before any work when not)."""
    pinned, required = session.pinned_version, request.required_weight_version
    if pinned and required and pinned != required:
        raise FailedPrecondition(
            f"required_weight_version: the session is pinned to {pinned!r:.200}, "
            f"not {required!r:.200}",
            reason=pb.ERROR_REASON_WRONG_WEIGHT_VERSION,
        )
    return pinned or required


def _aborted(request_id: str, ticket) -> pb.GenerateStreamResponse:
    return pb.GenerateStreamResponse(
        request_id=request_id,
        finish_reason=pb.FINISH_REASON_ABORT,
        weight_version=ticket.version,
        lora_adapter_version=ticket.adapter_version,
    )


def _usage(plan: turns.TurnPlan, out: turns.TurnOutput) -> pb.Usage:
    return pb.Usage(
        prompt_tokens=len(plan.prompt_ids),
        completion_tokens=len(out.ids),
        cached_prompt_tokens=out.cached_prompt_tokens,
    )
