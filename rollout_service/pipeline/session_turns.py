"""One model turn of a session, through the same pipeline as a generation
(generations.py): the caller's slot, the Abort registry, the engine seat,
the gate, the engine, the version spans. What a turn adds is the session:
one call at a time on it, a prompt planned from its history
(sessions/turns.py), and what it sampled written back once, however it
ends (finished, aborted, cancelled).

A turn's guards, in the one order they are taken (`SessionTurns._guarded`):
the caller's cap, the session's one call at a time, the engine seat, the
gate. Its state travels in one typed `Turn`.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from rollout.v1 import rollout_pb2 as pb
from rollout_service.engine.gate import Ticket
from rollout_service.fairness.identity import CallerId
from rollout_service.generation.convert import EnginePrompt
from rollout_service.generation.outputs import stream_delta_to_proto
from rollout_service.ops import logs
from rollout_service.ops.auth import CALLER
from rollout_service.pipeline.context import Admitted, Prepared
from rollout_service.pipeline.generations import Generations
from rollout_service.sessions import turns
from rollout_service.sessions.session_ids import SessionIds
from rollout_service.sessions.store import Session
from rollout_service.status.errors import FailedPrecondition


@dataclass
class Turn:
    """One turn as it runs: the session, what the engine is asked (`plan`)
    and what it sampled so far (`out`); `admitted` once it passed the gate,
    `committed` once its tokens are in the session."""

    session: Session
    plan: turns.TurnPlan
    prepared: Prepared
    omit_text: bool
    out: turns.TurnOutput
    admitted: Admitted | None = None
    committed: bool = False

    @property
    def request_id(self) -> str:
        return self.prepared.request_id

    @property
    def ticket(self) -> Ticket:
        assert self.admitted is not None, "a turn has a ticket once admitted"
        return self.admitted.ticket

    def usage(self) -> pb.Usage:
        return pb.Usage(
            prompt_tokens=len(self.plan.prompt_ids),
            completion_tokens=len(self.out.ids),
            cached_prompt_tokens=self.out.cached_prompt_tokens,
        )

    def finish_reason(self):  # a pb.FinishReason (the plan may make it BUDGET)
        return self.out.final_reason(self.plan)


@dataclass(frozen=True)
class TurnStep:
    """One message of a running turn: a delta as a stream sends it, and the
    session's state on the one that ends the turn."""

    turn: Turn
    delta: pb.GenerateStreamResponse
    state: pb.SessionState | None


class SessionTurns:
    """Session turns over the pipeline; `ids` are this run's session ids."""

    def __init__(self, generations: Generations, ids: SessionIds) -> None:
        self.generations = generations
        self.app = generations.app
        self.ids = ids

    def find(self, session_id: str) -> Session:
        """The caller's open session `session_id`; NOT_FOUND saying why not
        (not an id of this server's, another server's, lost in a restart,
        closed, expired), PERMISSION_DENIED for another caller's."""
        self.ids.check(session_id)
        return self.app.session_store.get(session_id, CALLER.get())

    async def generate(self, request: pb.SessionGenerateRequest, who: CallerId):
        """A whole turn, answered at its end (SessionGenerate)."""
        state = None
        async for step in self.run(request, None, who):
            turn, state = step.turn, step.state or state
        out = turn.out
        completion = pb.Completion(
            token_ids=out.ids,
            logprobs=out.logprobs,
            finish_reason=turn.finish_reason(),
            top_logprobs=out.top,
            stop_reason=out.stop_reason,
        )
        for v, start, count in out.spans:
            completion.version_spans.add(weight_version=v, start=start, count=count)
        tok = self.app.tokenizing
        if out.ids and tok.tokenizer is not None:
            completion.text = await tok.off_loop(tok.decode, out.ids, True)
        return pb.SessionGenerateResponse(
            request_id=turn.request_id,
            completion=completion,
            weight_version=turn.ticket.version,
            usage=turn.usage(),
            state=state,
            lora_adapter_version=turn.ticket.adapter_version,
        )

    async def stream(
        self, request: pb.SessionGenerateStreamRequest, who: CallerId
    ) -> AsyncIterator[pb.SessionGenerateStreamResponse]:
        """A turn's deltas as the engine makes them (SessionGenerateStream);
        the last carries how it ended, its usage and the session's state."""
        async for step in self.run(request, request.stream_options, who):
            delta = step.delta
            if step.state is not None:
                delta.finish_reason = step.turn.finish_reason()
                delta.usage.CopyFrom(step.turn.usage())
            yield pb.SessionGenerateStreamResponse(delta=delta, state=step.state)

    async def run(
        self, request, stream: pb.StreamOptions | None, who: CallerId
    ) -> AsyncIterator[TurnStep]:
        """Runs one turn past its guards; yields each delta, with the
        session's state on the one that finishes it."""
        async with self._guarded(request, stream, who) as turn:
            g = turn.admitted
            assert g is not None
            run = self.generations.run if stream is not None else self.generations.run_whole
            async for o in run(g):
                deltas = self._deltas(turn, o, stream is not None)
                state = self._finish(turn) if o.finished else None
                for i, d in enumerate(deltas):
                    yield TurnStep(turn, d, state if i == len(deltas) - 1 else None)
            if not turn.committed:  # aborted before it reached the engine
                turn.committed = True
                state = turns.state(turn.session, turn.plan, None)
                yield TurnStep(turn, _aborted(turn.request_id, g.ticket), state)

    @asynccontextmanager
    async def _guarded(
        self, request, stream: pb.StreamOptions | None, who: CallerId
    ) -> AsyncIterator[Turn]:
        """A turn past its guards, in their order: the caller's cap
        (fairness/), the engine alive and not degraded, the session found
        and not busy (one call at a time), its plan made (on the tokenizing
        thread), registered for Abort (and for CloseSession, which aborts
        it), then an engine seat and the gate. However the turn ends, what
        it sampled once admitted is written into the session."""
        app, generations = self.app, self.generations
        generations.check_alive()
        with app.fair.slot(who) as slot:
            generations.check_alive()
            app.served.check_serving()
            session = self.find(request.session_id)
            request_id = request.request_id or uuid.uuid4().hex
            logs.request_id.set(request_id)
            with app.session_store.using(session):
                turn = await self._plan(session, request, request_id, stream)
                with generations.registered(request_id) as call:
                    session.abort_turn = functools.partial(generations.abort, call)
                    try:
                        required = _required(request, session)
                        async with generations.seated(slot, call, required) as ticket:
                            turn.admitted = Admitted(turn.prepared, slot, call, ticket)
                            yield turn
                    finally:
                        session.abort_turn = None
                        if not turn.committed and turn.admitted is not None:
                            # Cancelled mid-turn: what it sampled stays, interrupted.
                            turns.commit(session, turn.plan, turn.out, turn.ticket.adapter_version)

    async def _plan(
        self, session: Session, request, request_id: str, stream: pb.StreamOptions | None
    ) -> Turn:
        """The turn's plan from the session's history (sessions/turns.py),
        on the tokenizing thread; nothing changes in the session."""
        tok = self.app.tokenizing
        plan = await tok.off_loop(
            turns.plan_turn,
            session,
            request.sampling_params,
            self.app.info.limits,
            tok,
            stream,
        )
        prompt = EnginePrompt({"prompt_token_ids": plan.prompt_ids}, len(plan.prompt_ids))
        # The required version is checked at the gate (_guarded), after the plan.
        prepared = Prepared(request_id, prompt, plan.params, session.lora_adapter, "")
        omit_text = stream.omit_text if stream is not None else True
        return Turn(session, plan, prepared, omit_text, turns.TurnOutput())

    def _deltas(self, turn: Turn, o, sent: bool) -> list[pb.GenerateStreamResponse]:
        """One engine output's deltas: gathered into `turn.out`, and as a
        stream sends them when `sent` (a whole turn, `generate`, sends none:
        an empty message stands for each; building them took about 3 % of
        the event loop's busy time under session URLs, py-spy, for nothing)."""
        out = turn.out
        out.cached_prompt_tokens = max(out.cached_prompt_tokens, o.num_cached_tokens or 0)
        return [self._delta(turn, c, sent) for c in o.outputs if c.token_ids or c.finish_reason]

    def _delta(self, turn: Turn, c, sent: bool) -> pb.GenerateStreamResponse:
        ticket, out = turn.ticket, turn.out
        top_k = turn.plan.params.logprobs or 0
        spans = self.generations.delta_spans(ticket, c, len(out.ids), len(c.token_ids))
        out.add(c, top_k, spans)
        if not sent:
            return pb.GenerateStreamResponse()
        return stream_delta_to_proto(
            turn.request_id, c, top_k, ticket.version, spans, turn.omit_text, ticket.adapter_version
        )

    @staticmethod
    def _finish(turn: Turn) -> pb.SessionState:
        """A finished turn: counted against its caller, written into the
        session; the session's state after it."""
        assert turn.admitted is not None
        plan, out = turn.plan, turn.out
        turn.admitted.slot.count(len(plan.prompt_ids), len(out.ids))
        turn.committed = True
        seg = turns.commit(turn.session, plan, out, turn.ticket.adapter_version)
        return turns.state(turn.session, plan, seg)


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


def _aborted(request_id: str, ticket: Ticket) -> pb.GenerateStreamResponse:
    return pb.GenerateStreamResponse(
        request_id=request_id,
        finish_reason=pb.FINISH_REASON_ABORT,
        weight_version=ticket.version,
        lora_adapter_version=ticket.adapter_version,
    )
