"""Pure conversions of rollout.v1 requests into what vLLM takes (the
prompt, the sampling parameters); the way back is outputs.py.

The static ranges are the contract's (the proto's protovalidate options,
checked by status/static_rules.py where a request enters the pipeline, before
these run). What is checked here depends on the served model or on other
fields (the context, the vocabulary, the engine's logprobs limit, min_tokens
against max_tokens), so that every bad field is caught before the engine sees
the request, with an INVALID_ARGUMENT naming the field. Nothing in this module
touches the engine: it is tested without one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind

from rollout.v1 import rollout_pb2 as pb
from rollout_service.engine.limits import ModelLimits
from rollout_service.generation.images import decoded_images
from rollout_service.generation.structured import structured_outputs_from_proto
from rollout_service.status.errors import InvalidArgument, ResourceExhausted


@dataclass(frozen=True)
class EnginePrompt:
    """A validated prompt, ready for `AsyncLLM.generate`."""

    prompt: dict[str, Any]
    # Known length in tokens, or None when the processor expands it (images).
    num_tokens: int | None
    # The server made the token ids (text or messages): the response returns them.
    echo_ids: bool = False


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
    """Validates `sp` against the model and its own other fields, and builds
    the vLLM SamplingParams for it; `sp` already holds to the contract's
    static ranges (static_rules.check). `stream`: a GenerateStream's
    delivery options."""
    stream = stream or _NO_STREAM_OPTIONS
    f = "sampling_params."
    room = limits.max_model_len - (prompt_tokens or 0)
    max_tokens: int | None
    if sp.HasField("max_tokens"):
        max_tokens = sp.max_tokens
        if prompt_tokens is not None and max_tokens > room:
            raise InvalidArgument(
                f + "max_tokens",
                f"prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) "
                f"exceeds max_model_len ({limits.max_model_len})",
            )
    else:
        max_tokens = None if prompt_tokens is None else room
    top_logprobs = sp.logprobs if sp.HasField("logprobs") else 0
    if top_logprobs > limits.max_logprobs:
        raise InvalidArgument(
            f + "logprobs",
            f"{top_logprobs} is over the engine's limit of {limits.max_logprobs}",
        )
    check_vocabulary(sp.stop_token_ids, limits.vocab_size, f + "stop_token_ids")
    allowed = list(sp.allowed_token_ids)
    check_vocabulary(allowed, limits.vocab_size, f + "allowed_token_ids")
    min_tokens = sp.min_tokens if sp.HasField("min_tokens") else 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise InvalidArgument(f + "min_tokens", f"{min_tokens} is over max_tokens ({max_tokens})")
    prompt_logprobs = sp.prompt_logprobs if sp.HasField("prompt_logprobs") else None
    if prompt_logprobs is not None and prompt_logprobs > limits.max_logprobs:
        raise InvalidArgument(
            f + "prompt_logprobs",
            f"{prompt_logprobs} is over the engine's limit of {limits.max_logprobs}",
        )
    # Unset: the defaults the proto names.
    return SamplingParams(
        n=sp.n if sp.HasField("n") else 1,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        temperature=sp.temperature if sp.HasField("temperature") else 1.0,
        top_p=sp.top_p if sp.HasField("top_p") else 1.0,
        top_k=sp.top_k if sp.HasField("top_k") else 0,
        min_p=sp.min_p if sp.HasField("min_p") else 0.0,
        seed=sp.seed if sp.HasField("seed") else None,
        # 0 asks vLLM for the sampled token's logprob only; RL trainers always
        # need it, so it is always on.
        logprobs=top_logprobs,
        stop=list(sp.stop) or None,
        stop_token_ids=list(sp.stop_token_ids) or None,
        allowed_token_ids=allowed or None,
        ignore_eos=sp.ignore_eos,
        repetition_penalty=sp.repetition_penalty if sp.HasField("repetition_penalty") else 1.0,
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
        presence_penalty=sp.presence_penalty if sp.HasField("presence_penalty") else 0.0,
        frequency_penalty=sp.frequency_penalty if sp.HasField("frequency_penalty") else 0.0,
    )


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
        prompt: dict[str, Any] = {"multi_modal_data": {"image": decoded_images(images)}}
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
