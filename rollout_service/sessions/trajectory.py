"""One session's trajectory: the token ids the server holds, each with its
source, the logprob and weight version of each sampled one, and the segments
(prompt, turns, appends) they came in, with the chat messages a segment
was rendered from. Pure data: no engine, no event loop; tested alone.

Memory is bounded by what it stores per token: the id (4 bytes), the source
(1) and the logprob (4), in flat arrays, plus per segment one small object
(`SEGMENT_BYTES`). The store reserves a session's whole budget when it opens
(store.py), so these never grow past what GetServerInfo states.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.generation.chat_entries import chat_message

# Flat arrays: id + source + logprob.
TOKEN_BYTES = 9
# A Segment and its list slot, measured with sys.getsizeof on CPython 3.11
# (about 300 bytes with two version spans), rounded up.
SEGMENT_BYTES = 512


@dataclass
class Segment:
    """A run of tokens of one source (a model turn stays one segment when it
    is interrupted and resumed)."""

    source: int  # pb.TokenSource
    start: int
    count: int = 0
    finish_reason: int = pb.FINISH_REASON_UNSPECIFIED
    stop_reason: str = ""
    resumed_at: list[int] = field(default_factory=list)
    cached_prompt_tokens: int = 0
    lora_adapter_version: str = ""
    # A model turn that ended on a stop token: that token's id (the bridge
    # of the next append does not repeat it).
    stop_token: int | None = None
    # An appended segment holding the template's generation prompt.
    generation_prompt: bool = False
    # An appended segment that starts a new context (HISTORY_RULE_RESTART).
    restarts_context: bool = False
    # The chat messages it was rendered from (text conversation entries): a
    # prompt's or an append's, or a restart's whole conversation; None for
    # turns, generation prompts, ids and text. Counted in Session.text_bytes.
    messages: list[dict[str, Any]] | None = None

    @property
    def interrupted(self) -> bool:
        return (
            self.source == pb.TOKEN_SOURCE_SAMPLED and self.finish_reason == pb.FINISH_REASON_ABORT
        )


class Trajectory:
    """Token ids with their sources, logprobs and versions, in segments."""

    def __init__(self) -> None:
        self.ids = array("I")
        self.sources = array("B")
        self.logprobs = array("f")
        # [version, start, count] over ids, sampled tokens only, in order;
        # adjacent runs of one version merged.
        self.spans: list[list] = []
        self.segments: list[Segment] = []
        # Where the context the next turn is conditioned on starts: 0, or the
        # start of the last segment that restarts_context.
        self.context_start = 0

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def last(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    def append(
        self, source: int, ids: Sequence[int], messages: list[dict[str, Any]] | None = None
    ) -> Segment:
        """A new segment of prompt or appended tokens (rendered from
        `messages`, when they came as chat messages)."""
        seg = Segment(source=source, start=len(self.ids), count=len(ids), messages=messages)
        self.ids.extend(ids)
        self.sources.extend([source] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.segments.append(seg)
        return seg

    def restart(self, ids: Sequence[int], conversation: list[dict[str, Any]]) -> Segment:
        """A new context: `ids` (`conversation` rendered) appended as a
        segment that later turns are conditioned on from its start."""
        seg = self.append(pb.TOKEN_SOURCE_APPENDED, ids, conversation)
        seg.restarts_context = True
        self.context_start = seg.start
        return seg

    def context(self) -> list[int]:
        """The ids the next turn is conditioned on."""
        return self.ids[self.context_start :].tolist()

    def begin_turn(self, cached_prompt_tokens: int = 0, lora_adapter_version: str = "") -> Segment:
        """A new model turn, or the interrupted one to resume (its
        `resumed_at` gets the point where this call's tokens start)."""
        last = self.last
        if last is not None and last.interrupted:
            last.resumed_at.append(last.count)
            last.finish_reason = pb.FINISH_REASON_UNSPECIFIED
            return last
        seg = Segment(
            source=pb.TOKEN_SOURCE_SAMPLED,
            start=len(self.ids),
            cached_prompt_tokens=cached_prompt_tokens,
            lora_adapter_version=lora_adapter_version,
        )
        self.segments.append(seg)
        return seg

    def sampled(
        self,
        seg: Segment,
        ids: Sequence[int],
        logprobs: Sequence[float],
        spans: Sequence[tuple[str, int, int]],
    ) -> None:
        """Adds tokens the turn `seg` (the last segment) sampled; `spans`:
        (version, start, count) indexed into `ids`."""
        assert seg is self.last
        base = len(self.ids)
        self.ids.extend(ids)
        self.sources.extend([pb.TOKEN_SOURCE_SAMPLED] * len(ids))
        lps = list(logprobs)
        self.logprobs.extend(lps + [0.0] * (len(ids) - len(lps)))
        seg.count += len(ids)
        for version, start, count in spans:
            top = self.spans[-1] if self.spans else None
            if top is not None and top[0] == version and top[1] + top[2] == base + start:
                top[2] += count
            else:
                self.spans.append([version, base + start, count])

    def end_turn(
        self, seg: Segment, finish_reason: int, stop_reason: str = "", on_token: bool = False
    ) -> None:
        """`on_token`: the turn stopped on a token it sampled last (eos or
        one of stop_token_ids), which the next bridge does not repeat."""
        seg.finish_reason = finish_reason
        seg.stop_reason = stop_reason
        seg.stop_token = self.ids[seg.start + seg.count - 1] if on_token and seg.count else None

    def turn_tokens(self, seg: Segment) -> list[int]:
        return list(self.ids[seg.start : seg.start + seg.count])


def segment_to_proto(seg: Segment) -> pb.TrajectorySegment:
    return pb.TrajectorySegment(
        source=seg.source,  # type: ignore[arg-type]
        start=seg.start,
        count=seg.count,
        finish_reason=seg.finish_reason,  # type: ignore[arg-type]
        stop_reason=seg.stop_reason,
        resumed_at=seg.resumed_at,
        cached_prompt_tokens=seg.cached_prompt_tokens,
        lora_adapter_version=seg.lora_adapter_version,
        stop_token_id=seg.stop_token,
        generation_prompt=seg.generation_prompt,
        restarts_context=seg.restarts_context,
    )


def snapshot(t: Trajectory, from_segment: int = 0) -> tuple[pb.GetSessionResponse, int]:
    """The trajectory's segments from `from_segment` on and the version spans
    that end past the first of them, as they are now (on the event loop: a
    turn ending changes them there; both are bounded by the segment bound),
    and the index of that segment's first token."""
    segments = t.segments[from_segment:]
    first = segments[0].start if segments else len(t.ids)
    out = pb.GetSessionResponse(segments=[segment_to_proto(s) for s in segments])
    for version, start, count in t.spans:
        if start + count > first:
            out.version_spans.add(weight_version=version, start=start, count=count)
    return out, first


def messages_to_proto(segments: Sequence[Segment], out: pb.GetSessionResponse) -> None:
    """Adds the messages each of `segments` was rendered from to `out`, one
    entry a segment, off the event loop (they grow with the history; a
    segment's messages never change once it is added)."""
    for seg in segments:
        out.messages.add(messages=[chat_message(m) for m in seg.messages or ()])


def tokens_to_proto(
    t: Trajectory, first: int, n: int, out: pb.GetSessionResponse
) -> pb.GetSessionResponse:
    """Adds tokens [first, n) (counted with the snapshot) to `out`, off the
    event loop: they grow with the history, and the arrays only grow meanwhile."""
    out.token_ids.extend(t.ids[first:n].tolist())
    # Plain ints: protoc's .pyi types the field's items as TokenSource members.
    out.sources.extend(t.sources[first:n].tolist())  # type: ignore[arg-type]
    out.logprobs.extend(t.logprobs[first:n].tolist())
    return out
