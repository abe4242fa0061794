"""One model turn of a session: its plan (prompt, limits, resumption), what
it sampled, and how that is written into the trajectory.

`plan_turn` runs on the tokenizing thread (the prompt is the whole history);
`TurnOutput` gathers the engine's deltas; `commit` writes them, once, when
the turn ends however it ends (finished, aborted, cancelled), so a turn's
tokens never interleave with another call's and partial ones are kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind

from rollout.v1 import rollout_pb2 as pb
from rollout_service.engine.limits import ModelLimits
from rollout_service.generation import convert, outputs
from rollout_service.sessions.conversation import rendered_ids
from rollout_service.sessions.store import Session
from rollout_service.sessions.trajectory import Segment
from rollout_service.status import static_rules
from rollout_service.status.errors import FailedPrecondition, InvalidArgument

_F = "sampling_params."


@dataclass(frozen=True)
class TurnPlan:
    """What the engine is asked, and what the answer means for the session."""

    prompt_ids: list[int]
    generation_prompt: list[int]
    params: SamplingParams
    resumed: bool
    # Tokens the budget leaves this call (its max_tokens is at most this):
    # a turn that ends on its length with all of them sampled ended on the
    # budget (FINISH_REASON_BUDGET), whatever max_tokens it asked for.
    room: int


def plan_turn(
    session: Session,
    sp: pb.SamplingParams,
    limits: ModelLimits,
    tok,
    stream: pb.StreamOptions | None,
) -> TurnPlan:
    """Validates a turn's sampling params against the session and builds
    its engine request (a stream's deltas as `stream` asks; None: a whole
    turn); nothing changes in the session."""
    static_rules.check(sp, "sampling_params")
    if sp.HasField("n") and sp.n != 1:
        raise InvalidArgument(
            _F + "n", "a session turn samples one completion; open a session per sample"
        )
    if sp.HasField("prompt_logprobs"):
        raise InvalidArgument(
            _F + "prompt_logprobs", "not in sessions: GetSession has every sampled logprob"
        )
    t = session.trajectory
    last = t.last
    resumed = last is not None and last.interrupted
    already = last.count if resumed and last is not None else 0
    if resumed and sp.HasField("structured_output"):
        raise InvalidArgument(
            _F + "structured_output",
            "an interrupted turn cannot resume under a constraint (its state is gone); "
            "append to end the turn, then start a new one",
        )
    gen = [] if resumed or not session.chat else rendered_ids(session, tok, [], True)
    # Room for the generation prompt and one token, in up to two segments.
    session.check_room(len(gen) + 1, "session_id", segments=0 if resumed else 1 + bool(gen))
    room = session.remaining - len(gen)
    want = None
    if sp.HasField("max_tokens"):
        want = sp.max_tokens - already
        if want < 1:
            raise InvalidArgument(
                _F + "max_tokens",
                f"{sp.max_tokens} allows no more tokens: the interrupted turn already holds "
                f"{already} (max_tokens limits the whole turn)",
            )
    turn = pb.SamplingParams()
    turn.CopyFrom(sp)
    turn.max_tokens = room if want is None else min(want, room)
    if sp.HasField("min_tokens"):
        turn.min_tokens = max(0, sp.min_tokens - already)
    prompt = t.context() + gen
    if len(prompt) >= limits.max_model_len:
        raise FailedPrecondition(
            f"session_id: the history is {len(prompt)} tokens; the model's context "
            f"(max_model_len) is {limits.max_model_len}",
            reason=pb.ERROR_REASON_SESSION_BUDGET,
        )
    convert.check_prompt_length(len(prompt), "session_id", limits)
    if stream is None:
        # A whole turn: the engine's first output and its last (which holds
        # every token since, aborted or not), not one per token: each output
        # wakes the event loop once for every running turn.
        stream = pb.StreamOptions(omit_text=True, delta_tokens=turn.max_tokens)
    params = convert.sampling_params_from_proto(
        turn, limits, len(prompt), RequestOutputKind.DELTA, stream
    )
    return TurnPlan(prompt, gen, params, resumed, room)


@dataclass
class TurnOutput:
    """What a turn sampled, gathered from the engine's deltas."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[pb.TopLogprobs] = field(default_factory=list)
    # (version, start, count) indexed into `ids`.
    spans: list[tuple[str, int, int]] = field(default_factory=list)
    finish_reason: int | None = None
    stop_reason: str = ""
    # Stopped on a token it sampled (eos: no stop_reason; a stop token id: an
    # int), not on a stop string.
    stopped_on_token: bool = False
    cached_prompt_tokens: int = 0

    def add(self, c, top_k: int, spans: list[tuple[str, int, int]]) -> None:
        """One delta of the turn's completion (a vLLM CompletionOutput);
        `spans` index into its token_ids."""
        base = len(self.ids)
        lps, top = outputs.logprobs_to_proto(c.token_ids, c.logprobs, top_k)
        self.ids.extend(c.token_ids)
        self.logprobs.extend(lps)
        self.top.extend(top)
        self.spans.extend((v, base + s, n) for v, s, n in spans)
        if c.finish_reason is not None:
            self.finish_reason = outputs.finish_reason_to_proto(c.finish_reason)
            self.stop_reason = outputs.stop_reason_to_str(c.stop_reason)
            self.stopped_on_token = c.finish_reason == "stop" and not isinstance(c.stop_reason, str)

    def final_reason(self, plan: TurnPlan) -> int:
        """How the turn ended (ABORT when it did not finish: cancelled).
        Its length with the budget full is the budget, even when max_tokens
        asked for exactly what was left: the trajectory can take no more."""
        reason = self.finish_reason if self.finish_reason is not None else pb.FINISH_REASON_ABORT
        if reason == pb.FINISH_REASON_LENGTH and len(self.ids) >= plan.room:
            return pb.FINISH_REASON_BUDGET
        return reason


def commit(
    session: Session, plan: TurnPlan, out: TurnOutput, adapter_version: str
) -> Segment | None:
    """Writes the turn into the session (nothing if it sampled nothing: a
    turn aborted before its first token leaves the session as it was)."""
    if not out.ids:
        return None
    t = session.trajectory
    if plan.generation_prompt:
        t.append(pb.TOKEN_SOURCE_APPENDED, plan.generation_prompt).generation_prompt = True
    seg = t.begin_turn(out.cached_prompt_tokens, adapter_version)
    t.sampled(seg, out.ids, out.logprobs, out.spans)
    t.end_turn(seg, out.final_reason(plan), out.stop_reason, out.stopped_on_token)
    session.add_turn_to_conversation(seg)
    return seg


def state(session: Session, plan: TurnPlan, seg: Segment | None) -> pb.SessionState:
    segments = session.trajectory.segments
    return pb.SessionState(
        segment_index=segments.index(seg) if seg is not None else max(0, len(segments) - 1),
        total_tokens=len(session.trajectory),
        budget_remaining=session.remaining,
        generation_prompt_token_ids=plan.generation_prompt if seg is not None else [],
        resumed=plan.resumed,
    )
