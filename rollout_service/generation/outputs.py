"""Pure conversions of vLLM's outputs into rollout.v1 messages (the way in
is convert.py): finish reasons, logprobs, version spans, completions, usage
and a stream's deltas. Nothing in this module touches the engine: it is
tested without one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm.logprobs import SampleLogprobs
from vllm.outputs import CompletionOutput, RequestOutput

from rollout.v1 import rollout_pb2 as pb

_FINISH_REASONS = {
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    "abort": pb.FINISH_REASON_ABORT,
}


def finish_reason_to_proto(reason: str | None) -> pb.FinishReason:
    """Maps vLLM's finish reason string to the proto enum."""
    if reason is None:
        return pb.FINISH_REASON_UNSPECIFIED
    return _FINISH_REASONS.get(reason, pb.FINISH_REASON_ABORT)


def logprobs_to_proto(
    token_ids: Sequence[int], logprobs: SampleLogprobs | None, top_k: int
) -> tuple[list[float], list[pb.TopLogprobs]]:
    """Splits vLLM's per-position logprob dicts into the sampled tokens'
    logprobs and, when `top_k` > 0, the top-k alternatives per position."""
    if not logprobs:
        return [], []
    # iter(): vLLM declares FlatLogprobs a sequence of `dict | None`, but it
    # iterates as dicts (its __iter__), which is what zip would call.
    positions = iter(logprobs)
    sampled = [float(position[token].logprob) for token, position in zip(token_ids, positions)]
    top: list[pb.TopLogprobs] = []
    if top_k > 0:
        for position in logprobs:
            best = sorted(position.items(), key=lambda kv: kv[1].rank or 0)[:top_k]
            top.append(
                pb.TopLogprobs(
                    token_ids=[t for t, _ in best], logprobs=[float(lp.logprob) for _, lp in best]
                )
            )
    return sampled, top


def stop_reason_to_str(reason: int | str | None) -> str:
    return "" if reason is None else str(reason)


def version_spans(
    spans: Sequence[Any] | None, start: int, count: int, fallback: str
) -> list[tuple[str, int, int]]:
    """The weight versions of tokens [start, start + count) of a completion,
    from vLLM's spans over the completion (WeightVersionSpan: version, start,
    end), indexed from `start`, as (weight_version, start, count) for
    add_spans; `fallback` labels tokens vLLM labelled none."""
    if not count:
        return []
    if not spans:
        return [(fallback, 0, count)]
    end = start + count
    out = []
    for s in spans:
        lo, hi = max(s.start, start), min(s.end, end)
        if lo < hi:
            out.append((s.version, lo - start, hi - lo))
    return out


def add_spans(field, spans: list[tuple[str, int, int]]) -> None:
    """Fills a repeated VersionSpan field from version_spans (added in place:
    cheaper than building VersionSpan messages and copying them in)."""
    for version, start, count in spans:
        field.add(weight_version=version, start=start, count=count)


def prompt_logprobs_to_proto(out: RequestOutput, top_k: int, message) -> None:
    """Fills prompt_logprobs (and prompt_top_logprobs) of a response message
    from vLLM's per-position dicts (the first position has none)."""
    positions = out.prompt_logprobs
    if not positions:
        return
    ids = out.prompt_token_ids or []
    pairs = [(t, p) for t, p in zip(ids, positions) if p is not None]
    sampled, top = logprobs_to_proto([t for t, _ in pairs], [p for _, p in pairs], top_k)
    message.prompt_logprobs.extend(sampled)
    message.prompt_top_logprobs.extend(top)


def completion_to_proto(
    out: CompletionOutput, top_k: int, decode=None, version: str = ""
) -> pb.Completion:
    """Converts one finished vLLM completion. `decode` (token ids to text)
    supplies the text when vLLM did not detokenize; `version` labels its
    tokens where vLLM's own spans do not."""
    logprobs, top = logprobs_to_proto(out.token_ids, out.logprobs, top_k)
    text = out.text or ""
    if not text and decode is not None and out.token_ids:
        text = decode(out.token_ids)
    completion = pb.Completion(
        index=out.index,
        token_ids=list(out.token_ids),
        logprobs=logprobs,
        finish_reason=finish_reason_to_proto(out.finish_reason),
        text=text,
        top_logprobs=top,
        stop_reason=stop_reason_to_str(out.stop_reason),
    )
    add_spans(
        completion.version_spans,
        version_spans(out.weight_versions, 0, len(out.token_ids), version),
    )
    return completion


def aborted_response(request_id: str, n: int, version: str) -> pb.GenerateResponse:
    """The response of a call aborted before it reached the engine."""
    return pb.GenerateResponse(
        request_id=request_id,
        completions=[
            pb.Completion(index=i, finish_reason=pb.FINISH_REASON_ABORT) for i in range(n)
        ],
        weight_version=version,
        usage=pb.Usage(),
    )


def usage_to_proto(out: RequestOutput) -> pb.Usage:
    """Token counts of a finished request."""
    return pb.Usage(
        prompt_tokens=len(out.prompt_token_ids or []),
        completion_tokens=sum(len(c.token_ids) for c in out.outputs),
        cached_prompt_tokens=out.num_cached_tokens or 0,
    )


def stream_delta_to_proto(
    request_id: str,
    out: CompletionOutput,
    top_k: int,
    weight_version: str,
    spans: list[tuple[str, int, int]] | None = None,
    omit_text: bool = False,
    lora_adapter_version: str = "",
) -> pb.GenerateStreamResponse:
    """Converts one delta (RequestOutputKind.DELTA) of one completion;
    `spans` label its tokens (version_spans), the first one's version is the
    delta's weight_version; `omit_text` leaves the text out.

    One of these is built per completion per engine step, so only the fields
    that differ from their defaults are passed (each keyword costs the
    constructor, default or not; BENCHMARKS.md, stop 23)."""
    fields: dict[str, Any] = {}
    if out.index:
        fields["index"] = out.index
    if out.logprobs:
        fields["logprobs"], top = logprobs_to_proto(out.token_ids, out.logprobs, top_k)
        if top:
            fields["top_logprobs"] = top
    if out.text and not omit_text:
        fields["text"] = out.text
    if out.finish_reason is not None:
        fields["finish_reason"] = finish_reason_to_proto(out.finish_reason)
    if out.stop_reason is not None:
        fields["stop_reason"] = stop_reason_to_str(out.stop_reason)
    if lora_adapter_version:
        fields["lora_adapter_version"] = lora_adapter_version
    if spans:
        weight_version = spans[0][0]
    delta = pb.GenerateStreamResponse(
        request_id=request_id, token_ids=out.token_ids, weight_version=weight_version, **fields
    )
    if spans:
        add_spans(delta.version_spans, spans)
    return delta
