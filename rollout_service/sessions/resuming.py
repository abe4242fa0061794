"""OpenSession's `resume`: a trajectory another server held, re-opened from
the caller's copy (a Fleet moving a session off a replica that is gone).

Checked for shape before anything is held, then replayed segment by segment
through the same Session methods the live calls use, so the resumed session
renders its next append exactly as the one it replaces would have. Runs on
the tokenizing thread: the checks grow with the history.

What cannot be checked is said, not hidden: the sampled tokens, their
logprobs and versions are the caller's word (GetSessionResponse.resumed_tokens).
"""

from __future__ import annotations

import math
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.engine.limits import ModelLimits
from rollout_service.generation import convert
from rollout_service.sessions.opening import check_text, load_tools, text_conversation
from rollout_service.sessions.store import MAX_SEGMENTS, Session
from rollout_service.sessions.trajectory import Segment
from rollout_service.status.errors import FailedPrecondition, InvalidArgument

# Version spans a history may bring: a turn makes one, plus one per
# PAUSE_MODE_KEEP update that lands inside it.
MAX_SPANS = 2 * MAX_SEGMENTS
# Version names, stop reasons and adapter versions, in characters.
MAX_NAME = 1024

_T = "resume.trajectory."
_SAMPLED = pb.TOKEN_SOURCE_SAMPLED
_PROMPT = pb.TOKEN_SOURCE_PROMPT
_APPENDED = pb.TOKEN_SOURCE_APPENDED
_FINISH = set(pb.FinishReason.values())


def _name(value: str, field: str) -> str:
    if len(value) > MAX_NAME:
        raise InvalidArgument(field, f"{len(value)} characters, at most {MAX_NAME}")
    return value


def _check_sizes(h: pb.SessionHistory, budget: int) -> int:
    """The counts, before any per-token work."""
    t = h.trajectory
    n = len(t.token_ids)
    if n == 0:
        raise InvalidArgument(_T + "token_ids", "a resumed trajectory holds at least its prompt")
    if n > budget:
        raise FailedPrecondition(
            f"{_T}token_ids: {n} tokens do not fit the session's budget "
            f"(max_total_tokens) of {budget}",
            reason=pb.ERROR_REASON_SESSION_BUDGET,
        )
    for name in ("sources", "logprobs"):
        if len(getattr(t, name)) != n:
            raise InvalidArgument(
                _T + name, f"{len(getattr(t, name))} entries for {n} token_ids (one each)"
            )
    if not 1 <= len(t.segments) <= MAX_SEGMENTS:
        raise InvalidArgument(
            _T + "segments", f"{len(t.segments)} segments, between 1 and {MAX_SEGMENTS}"
        )
    if len(t.version_spans) > MAX_SPANS:
        raise InvalidArgument(
            _T + "version_spans", f"{len(t.version_spans)} spans, at most {MAX_SPANS}"
        )
    if h.messages and len(h.messages) != len(t.segments):
        raise InvalidArgument(
            "resume.messages",
            f"{len(h.messages)} entries for {len(t.segments)} segments (one each, or none)",
        )
    return n


def _segment(t: pb.GetSessionResponse, i: int, at: int, has_messages: bool) -> Segment:
    """Segment `i`, starting at token `at`, checked against its tokens."""
    p = t.segments[i]
    f = f"{_T}segments[{i}]."
    if p.source not in (_PROMPT, _SAMPLED, _APPENDED) or (p.source == _PROMPT) != (i == 0):
        raise InvalidArgument(f + "source", "the first segment is the prompt, and only it")
    if p.start != at:
        raise InvalidArgument(f + "start", f"{p.start}; segments tile token_ids: expected {at}")
    if at + p.count > len(t.token_ids) or (p.count == 0 and p.source != _SAMPLED):
        raise InvalidArgument(f + "count", f"{p.count} tokens from {at} of {len(t.token_ids)}")
    turn_fields = (
        p.finish_reason
        or p.stop_reason
        or p.resumed_at
        or p.cached_prompt_tokens
        or p.lora_adapter_version
        or p.HasField("stop_token_id")
    )
    if p.source != _SAMPLED and turn_fields:
        raise InvalidArgument(f, "a prompt or appended segment has no turn fields")
    if p.restarts_context and (p.source != _APPENDED or not has_messages):
        raise InvalidArgument(f + "restarts_context", "marks appended segments with messages")
    if p.generation_prompt and (p.source != _APPENDED or has_messages):
        raise InvalidArgument(f + "generation_prompt", "marks appended segments without messages")
    if has_messages and p.source == _SAMPLED:
        raise InvalidArgument(f"resume.messages[{i}]", "a model turn is rendered from its tokens")
    if p.finish_reason not in _FINISH:
        raise InvalidArgument(f + "finish_reason", f"{p.finish_reason} is not a FinishReason")
    previous = 0
    for k, offset in enumerate(p.resumed_at):
        if not previous < offset <= p.count:
            raise InvalidArgument(f + f"resumed_at[{k}]", "increasing offsets into the turn")
        previous = offset
    last = t.token_ids[at + p.count - 1] if p.count else None
    if p.HasField("stop_token_id") and (
        p.stop_token_id != last or p.finish_reason != pb.FINISH_REASON_STOP
    ):
        raise InvalidArgument(f + "stop_token_id", "is the last token of a turn that stopped")
    for k in range(at, at + p.count):
        if t.sources[k] != p.source:
            raise InvalidArgument(f"{_T}sources[{k}]", f"is not its segment's ({p.source})")
        lp = t.logprobs[k]
        if (p.source == _SAMPLED and not math.isfinite(lp)) or (p.source != _SAMPLED and lp):
            raise InvalidArgument(f"{_T}logprobs[{k}]", "finite for sampled tokens, 0 otherwise")
    return Segment(
        source=p.source,
        start=at,
        count=p.count,
        finish_reason=p.finish_reason,
        stop_reason=_name(p.stop_reason, f + "stop_reason"),
        resumed_at=list(p.resumed_at),
        cached_prompt_tokens=p.cached_prompt_tokens,
        lora_adapter_version=_name(p.lora_adapter_version, f + "lora_adapter_version"),
        stop_token=p.stop_token_id if p.HasField("stop_token_id") else None,
        generation_prompt=p.generation_prompt,
        restarts_context=p.restarts_context,
    )


def _spans(t: pb.GetSessionResponse) -> list[list[Any]]:
    """The version spans, covering every sampled token once, in order."""
    spans: list[list[Any]] = []
    end = 0
    covered = 0
    for k, s in enumerate(t.version_spans):
        f = f"{_T}version_spans[{k}]"
        if not s.weight_version or s.count == 0 or s.start < end:
            raise InvalidArgument(f, "spans name a version and cover tokens in order")
        end = s.start + s.count
        if end > len(t.token_ids) or any(t.sources[j] != _SAMPLED for j in range(s.start, end)):
            raise InvalidArgument(f, "covers tokens that were not sampled")
        covered += s.count
        spans.append([_name(s.weight_version, f + ".weight_version"), s.start, s.count])
    if covered != sum(1 for s in t.sources if s == _SAMPLED):
        raise InvalidArgument(_T + "version_spans", "must cover every sampled token")
    return spans


def resume(
    session: Session, request: pb.OpenSessionRequest, limits: ModelLimits, whole: bool
) -> list[int]:
    """The history into the new `session` (nothing held if it is refused:
    the caller drops the session); returns its token ids."""
    h = request.resume
    t = h.trajectory
    _check_sizes(h, session.budget)
    if request.pin_weight_version:
        raise InvalidArgument(
            "pin_weight_version", "with resume the history's pinned_weight_version is the pin"
        )
    ids = list(t.token_ids)
    convert.check_vocabulary(ids, limits.vocab_size, _T + "token_ids")
    trajectory = session.trajectory
    at = 0
    for i in range(len(t.segments)):
        entry = h.messages[i].messages if h.messages else ()
        seg = _segment(t, i, at, bool(entry))
        at += seg.count
        field = f"resume.messages[{i}].messages"
        messages = text_conversation(entry, field) if entry else None
        # Text is held as the live calls hold it: every segment's messages.
        nbytes = check_text(messages, field, session.text_bytes, session.budget) if messages else 0
        seg.messages = messages
        if i == 0:
            session.tools = load_tools(request, messages is not None)
            session.opened_with(messages, whole, nbytes)
            if messages is not None:  # what its base URL's first chat must start with
                session.resumed_prompt = [dict(m) for m in messages]
        elif seg.source == _SAMPLED:
            session.add_turn_to_conversation(seg)
        elif messages is not None and seg.restarts_context:
            session.restarted_with(messages, nbytes)
            trajectory.context_start = seg.start
            # What its base URL's first chat must start with: the new context's.
            session.resumed_prompt = [dict(m) for m in messages]
        elif messages is not None:
            session.appended_messages(messages, nbytes)
        elif not seg.generation_prompt:
            session.appended_ids()
        trajectory.segments.append(seg)
    if at != len(ids):
        raise InvalidArgument(_T + "segments", f"cover {at} of the {len(ids)} token_ids")
    trajectory.spans = _spans(t)
    trajectory.ids.extend(ids)
    trajectory.sources.extend(t.sources)
    trajectory.logprobs.extend(t.logprobs)
    session.pinned_version = _name(t.pinned_weight_version, _T + "pinned_weight_version")
    session.resumed_tokens = len(ids)
    return ids
