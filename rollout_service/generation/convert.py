"""Pure conversions between rollout.v1 messages and vLLM objects.

Validation lives here too, so that every bad field is caught before the
engine sees the request, with an INVALID_ARGUMENT naming the field. Nothing in
this module touches the engine: it is tested without one.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vllm import SamplingParams
from vllm.logprobs import SampleLogprobs
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind

from rollout.v1 import rollout_pb2 as pb
from rollout_service.engine.limits import ModelLimits
from rollout_service.errors import InvalidArgument, ResourceExhausted
from rollout_service.generation.structured import structured_outputs_from_proto


@dataclass(frozen=True)
class EnginePrompt:
    """A validated prompt, ready for `AsyncLLM.generate`."""

    prompt: dict[str, Any]
    # Known length in tokens, or None when the processor expands it (images).
    num_tokens: int | None
    # The server made the token ids (text or messages): the response returns them.
    echo_ids: bool = False


def _finite(field: str, value: float) -> float:
    if not math.isfinite(value):
        raise InvalidArgument(field, f"must be a finite number, got {value}")
    return value


def check_prompt_length(n: int, field: str, limits: ModelLimits, at_least: bool = False) -> None:
    """Refuses a prompt of `n` tokens over the limits; `at_least`: `n` is a
    lower bound known before tokenizing (from the text's length), so a text
    that cannot fit is refused before any tokenizer work."""
    size = f"at least {n}" if at_least else str(n)
    if limits.max_prompt_tokens is not None and n > limits.max_prompt_tokens:
        raise ResourceExhausted(
            f"{field}: prompt is {size} tokens, over the limit of "
            f"{limits.max_prompt_tokens} (--max-prompt-tokens)"
        )
    if n >= limits.max_model_len:
        raise InvalidArgument(
            field,
            f"prompt is {size} tokens; it must be shorter than max_model_len "
            f"({limits.max_model_len}) to leave room for one generated token",
        )


def _chat_chars(messages: Sequence[pb.ChatMessage]) -> int:
    """Characters of the messages' roles and text: the rendered prompt has at
    least as many."""
    return sum(len(m.role) + sum(len(p.text) for p in m.content) for m in messages)


def render_within(
    tok, messages: Sequence[pb.ChatMessage], options: pb.ChatOptions, limits: ModelLimits
):
    """Chat messages rendered with the template (Generate and Tokenize alike);
    a chat whose text alone cannot fit is refused before it is rendered."""
    check_prompt_length(tok.min_tokens(_chat_chars(messages)), "messages", limits, True)
    return tok.render(messages, options)


def encode_within(
    tok, text: str, field: str, limits: ModelLimits, add_special_tokens: bool = True
) -> list[int]:
    """Text to token ids (Generate and Tokenize alike); a text that cannot
    fit is refused before it is tokenized."""
    check_prompt_length(tok.min_tokens(len(text)), field, limits, at_least=True)
    return tok.encode(text, field, add_special_tokens=add_special_tokens)


def check_vocabulary(ids: Sequence[int], vocab_size: int, field: str) -> None:
    """Refuses the first id outside [0, vocab_size), naming `field[i]`."""
    for i, token in enumerate(ids):
        if token >= vocab_size:
            raise InvalidArgument(
                f"{field}[{i}]", f"token id {token} is outside the vocabulary [0, {vocab_size})"
            )


# Generate's (and a stream's without them): read only, made once.
_NO_STREAM_OPTIONS = pb.StreamOptions()


def sampling_params_from_proto(
    sp: pb.SamplingParams,
    limits: ModelLimits,
    prompt_tokens: int | None,
    output_kind: RequestOutputKind,
    stream: pb.StreamOptions | None = None,
) -> SamplingParams:
    """Validates `sp` and builds the vLLM SamplingParams for it; `stream`:
    a GenerateStream's delivery options."""
    stream = stream or _NO_STREAM_OPTIONS
    f = "sampling_params."
    room = limits.max_model_len - (prompt_tokens or 0)
    max_tokens: int | None
    if sp.HasField("max_tokens"):
        if sp.max_tokens == 0:
            raise InvalidArgument(f + "max_tokens", "must be at least 1")
        max_tokens = sp.max_tokens
        if prompt_tokens is not None and max_tokens > room:
            raise InvalidArgument(
                f + "max_tokens",
                f"prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) "
                f"exceeds max_model_len ({limits.max_model_len})",
            )
    else:
        max_tokens = None if prompt_tokens is None else room
    temperature = _finite(f + "temperature", sp.temperature) if sp.HasField("temperature") else 1.0
    if temperature < 0:
        raise InvalidArgument(f + "temperature", f"must be >= 0, got {temperature}")
    top_p = _finite(f + "top_p", sp.top_p) if sp.HasField("top_p") else 1.0
    if not 0 < top_p <= 1:
        raise InvalidArgument(f + "top_p", f"must be in (0, 1], got {top_p}")
    top_k = sp.top_k if sp.HasField("top_k") else 0
    if top_k < -1:
        raise InvalidArgument(f + "top_k", f"must be -1, 0 (disabled) or positive, got {top_k}")
    min_p = _finite(f + "min_p", sp.min_p) if sp.HasField("min_p") else 0.0
    if not 0 <= min_p <= 1:
        raise InvalidArgument(f + "min_p", f"must be in [0, 1], got {min_p}")
    n = sp.n if sp.HasField("n") else 1
    if n < 1:
        raise InvalidArgument(f + "n", "must be at least 1")
    top_logprobs = sp.logprobs if sp.HasField("logprobs") else 0
    if top_logprobs > limits.max_logprobs:
        raise InvalidArgument(
            f + "logprobs",
            f"{top_logprobs} is over the engine's limit of {limits.max_logprobs}",
        )
    check_vocabulary(sp.stop_token_ids, limits.vocab_size, f + "stop_token_ids")
    allowed = list(sp.allowed_token_ids)
    check_vocabulary(allowed, limits.vocab_size, f + "allowed_token_ids")
    if len(set(allowed)) != len(allowed):
        raise InvalidArgument(f + "allowed_token_ids", "lists a token id twice")
    for i, stop in enumerate(sp.stop):
        if not stop:
            raise InvalidArgument(f"{f}stop[{i}]", "must not be empty")
    repetition_penalty = (
        _finite(f + "repetition_penalty", sp.repetition_penalty)
        if sp.HasField("repetition_penalty")
        else 1.0
    )
    if repetition_penalty <= 0:
        raise InvalidArgument(f + "repetition_penalty", f"must be > 0, got {repetition_penalty}")
    presence_penalty = _penalty(sp, "presence_penalty")
    frequency_penalty = _penalty(sp, "frequency_penalty")
    min_tokens = sp.min_tokens if sp.HasField("min_tokens") else 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise InvalidArgument(f + "min_tokens", f"{min_tokens} is over max_tokens ({max_tokens})")
    prompt_logprobs = sp.prompt_logprobs if sp.HasField("prompt_logprobs") else None
    if prompt_logprobs is not None and prompt_logprobs > limits.max_logprobs:
        raise InvalidArgument(
            f + "prompt_logprobs",
            f"{prompt_logprobs} is over the engine's limit of {limits.max_logprobs}",
        )
    return SamplingParams(
        n=n,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        seed=sp.seed if sp.HasField("seed") else None,
        # 0 asks vLLM for the sampled token's logprob only; RL trainers always
        # need it, so it is always on.
        logprobs=top_logprobs,
        stop=list(sp.stop) or None,
        stop_token_ids=list(sp.stop_token_ids) or None,
        allowed_token_ids=allowed or None,
        ignore_eos=sp.ignore_eos,
        repetition_penalty=repetition_penalty,
        prompt_logprobs=prompt_logprobs,
        structured_outputs=structured_outputs_from_proto(sp.structured_output),
        output_kind=output_kind,
        # vLLM's output processor detokenizes every token incrementally and
        # decodes every logprob's token (py-spy: ~40% of the server's event
        # loop at 64 concurrent unary calls). A unary response needs the text
        # only once, at the end (see completion_to_proto); stop strings and
        # streamed text deltas still need vLLM's incremental detokenizer.
        detokenize=bool(sp.stop)
        or (output_kind != RequestOutputKind.FINAL_ONLY and not stream.omit_text),
        # Deltas of several tokens: fewer outputs for vLLM to build and
        # fewer messages to send (the first and the last come at once).
        stream_interval=stream.delta_tokens if stream.delta_tokens > 1 else None,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
    )


def _penalty(sp: pb.SamplingParams, name: str) -> float:
    """presence_penalty or frequency_penalty: in [-2, 2], 0 when unset."""
    field = "sampling_params." + name
    value = _finite(field, getattr(sp, name)) if sp.HasField(name) else 0.0
    if not -2 <= value <= 2:
        raise InvalidArgument(field, f"must be in [-2, 2], got {value}")
    return value


def _decode_images(images: Sequence[pb.Image]) -> list[Any]:
    from PIL import Image, UnidentifiedImageError

    decoded = []
    for i, image in enumerate(images):
        try:
            img = Image.open(io.BytesIO(image.data))
            img.load()
        except (UnidentifiedImageError, OSError, ValueError) as e:
            raise InvalidArgument(f"images[{i}].data", f"is not a PNG or JPEG image ({e})") from e
        if img.format not in ("PNG", "JPEG"):
            raise InvalidArgument(f"images[{i}].data", f"is {img.format}, expected PNG or JPEG")
        decoded.append(img.convert("RGB"))
    return decoded


def prompt_field(request) -> str:
    """Which one of a request's prompt_token_ids, prompt_text and messages
    is set (Generate and OpenSession alike); INVALID_ARGUMENT unless one is."""
    given = [
        name
        for name, present in (
            ("prompt_token_ids", len(request.prompt_token_ids) > 0),
            ("prompt_text", len(request.prompt_text) > 0),
            ("messages", len(request.messages) > 0),
        )
        if present
    ]
    if len(given) != 1:
        raise InvalidArgument(
            "prompt_token_ids/prompt_text/messages",
            "exactly one must be set, got " + (" and ".join(given) if given else "none"),
        )
    return given[0]


def prompt_from_request(request: pb.GenerateRequest, limits: ModelLimits, tok) -> EnginePrompt:
    """Validates the prompt fields of `request` and builds the engine prompt.

    `tok` is the served model's tokenizing.Tokenizing (text and chat messages
    to token ids).
    """
    field = prompt_field(request)
    images = list(request.images)
    text = request.prompt_text
    if field == "messages":
        if images:
            raise InvalidArgument("images", "with messages, images go inside the messages")
        rendered = render_within(tok, request.messages, request.chat_options, limits)
        images, text = rendered.images, rendered.text
    elif request.HasField("chat_options"):
        raise InvalidArgument("chat_options", "applies to messages only")
    if images and not limits.supports_images:
        raise InvalidArgument(
            "images" if field != "messages" else "messages",
            "this model is text-only and takes no images",
        )
    if images:
        # The processor expands image placeholders, so the length is known
        # only to the engine; it validates the total itself.
        prompt: dict[str, Any] = {"multi_modal_data": {"image": _decode_images(images)}}
        if field == "prompt_token_ids":
            prompt["prompt_token_ids"] = list(request.prompt_token_ids)
        else:
            prompt["prompt"] = text
        return EnginePrompt(prompt=prompt, num_tokens=None, echo_ids=field != "prompt_token_ids")
    if field == "prompt_token_ids":
        ids = list(request.prompt_token_ids)
    elif field == "messages":
        ids = tok.chat_ids(rendered)
    else:
        ids = encode_within(tok, text, field, limits)
    check_prompt_length(len(ids), field, limits)
    check_vocabulary(ids, limits.vocab_size, "prompt_token_ids")
    if not ids:
        raise InvalidArgument(field, "tokenizes to no tokens")
    return EnginePrompt(
        prompt={"prompt_token_ids": ids}, num_tokens=len(ids), echo_ids=field != "prompt_token_ids"
    )


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
