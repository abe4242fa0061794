"""What a generation takes: the keyword options of `generate` and
`generate_stream` (the sync and the asyncio client's, typed once here, as
the proto names them) and the one builder of their requests.

The options are TypedDicts, so that the clients' `**options:
Unpack[GenerateOptions]` shows every name and type to a type checker and an
editor, and a misspelled name fails before any call: at type-check time, and
at run time as the TypeError Python raises for an unknown keyword
(tests/unit/client/test_client_surface.py checks that every proto field has its option).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict, Unpack

from rollout.v1 import rollout_pb2 as pb

_SAMPLING_FIELDS = {f.name for f in pb.SamplingParams.DESCRIPTOR.fields}


class Sampling(TypedDict, total=False):
    """SamplingParams' fields (proto/rollout/v1/rollout.proto says what each
    means); None or absent: unset, the server's default."""

    max_tokens: int | None
    temperature: float | None  # 0: greedy
    top_p: float | None
    top_k: int | None
    min_p: float | None
    seed: int | None
    n: int | None  # completions of the prompt
    logprobs: int | None  # alternatives per generated token
    stop: Sequence[str] | None
    stop_token_ids: Sequence[int] | None
    ignore_eos: bool | None
    repetition_penalty: float | None
    presence_penalty: float | None
    frequency_penalty: float | None
    min_tokens: int | None
    prompt_logprobs: int | None  # alternatives per prompt position
    structured_output: pb.StructuredOutput | None  # pb.StructuredOutput(regex=...)
    allowed_token_ids: Sequence[int] | None


class GenerateOptions(Sampling, total=False):
    """A Generate call's options: the prompt (exactly one of `prompt_text`,
    `prompt_token_ids`, chat `messages`), what the call runs on, and the
    sampling settings (Sampling)."""

    prompt_text: str | None
    prompt_token_ids: Sequence[int] | None
    # ChatMessage protos or dicts (chat_messages); `images` then stays empty.
    messages: Sequence[Any] | None
    # Leave the last (assistant) message open: the completion continues it.
    continue_final_message: bool
    images: Sequence[bytes] | None  # PNG, JPEG or WebP, in the order of the prompt's placeholders
    request_id: str  # for logs and abort(); the server makes one when empty
    lora_adapter: str  # a loaded LoRA adapter's name; empty: the base model
    # Run only on this weight version (else RolloutError, reason
    # WRONG_WEIGHT_VERSION, before any token).
    required_weight_version: str


class StreamOptions(GenerateOptions, total=False):
    """GenerateStream's options: Generate's and its StreamOptions."""

    delta_tokens: int  # tokens per delta (0: as they come; the first and the last at once)
    omit_text: bool  # token ids only


_GENERATE = frozenset(GenerateOptions.__annotations__) | _SAMPLING_FIELDS
_STREAM = _GENERATE | frozenset(StreamOptions.__annotations__)


def check_names(given: Mapping[str, object], known: frozenset[str] | set[str]) -> None:
    """The TypeError Python raises for an unknown keyword, with the
    nearest known name when there is one."""
    unknown = sorted(set(given) - known)
    if not unknown:
        return
    hints = []
    for name in unknown:
        near = difflib.get_close_matches(name, known, n=1)
        hints.append(f"{name!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    what = "unexpected keyword arguments" if len(hints) > 1 else "an unexpected keyword argument"
    raise TypeError(f"got {what} {', '.join(hints)}")


def _part(part: Any) -> pb.ContentPart:
    if isinstance(part, pb.ContentPart):
        return part
    if isinstance(part, str):
        return pb.ContentPart(text=part)
    if isinstance(part, (bytes, bytearray)):
        return pb.ContentPart(image=pb.Image(data=bytes(part)))
    if isinstance(part, dict) and part.get("type") == "text":
        return pb.ContentPart(text=part["text"])
    if isinstance(part, dict) and part.get("type") == "image":
        return pb.ContentPart(image=pb.Image(data=part["data"]))
    raise TypeError(f"a content part is text, image bytes or a ContentPart, got {part!r}")


def chat_messages(messages: Sequence[Any]) -> list[pb.ChatMessage]:
    """Chat messages from ChatMessage protos or dicts such as
    {"role": "user", "content": "Hi"} or {"role": "user", "content":
    ["Describe", png_bytes]} (str parts are text, bytes parts images); an
    OpenAI message's `tool_calls` (arguments as JSON text or a JSON value),
    `tool_call_id` and `reasoning` (or `reasoning_content`) are kept."""
    out = []
    for m in messages:
        if isinstance(m, pb.ChatMessage):
            out.append(m)
            continue
        content = m.get("content")
        parts = [] if content is None else [content] if isinstance(content, str) else list(content)
        message = pb.ChatMessage(
            role=m["role"],
            content=[_part(p) for p in parts],
            tool_call_id=m.get("tool_call_id") or "",
            reasoning=m.get("reasoning") or m.get("reasoning_content") or "",
        )
        for call in m.get("tool_calls") or ():
            function = call["function"]
            arguments = function.get("arguments", "")
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            message.tool_calls.add(
                id=call.get("id") or "", name=function["name"], arguments=arguments
            )
        out.append(message)
    return out


def sampling_params(fields: Mapping[str, Any]) -> pb.SamplingParams:
    """SamplingParams from keyword arguments (None: unset); TypeError names
    any that SamplingParams does not have."""
    unknown = set(fields) - _SAMPLING_FIELDS
    if unknown:
        raise TypeError(f"unknown sampling parameter(s): {sorted(unknown)}")
    return pb.SamplingParams(**{k: v for k, v in fields.items() if v is not None})


def build_generate_request(**options: Unpack[GenerateOptions]) -> pb.GenerateRequest:
    """The GenerateRequest of `options` (GenerateOptions)."""
    check_names(options, _GENERATE)
    return _generate_request(dict(options))


def _generate_request(o: dict[str, Any]) -> pb.GenerateRequest:
    """The request of checked options (popped: what is left is sampling)."""
    prompt = {
        "request_id": o.pop("request_id", ""),
        "prompt_text": o.pop("prompt_text", None) or "",
        "prompt_token_ids": o.pop("prompt_token_ids", None) or [],
        "images": [pb.Image(data=d) for d in o.pop("images", None) or []],
        "messages": chat_messages(o.pop("messages", None) or []),
        "lora_adapter": o.pop("lora_adapter", ""),
        "required_weight_version": o.pop("required_weight_version", ""),
    }
    continue_final_message = o.pop("continue_final_message", False)
    request = pb.GenerateRequest(**prompt, sampling_params=sampling_params(o))
    if continue_final_message:
        request.chat_options.continue_final_message = True
    return request


def build_generate_stream_request(**options: Unpack[StreamOptions]) -> pb.GenerateStreamRequest:
    """The same request for GenerateStream (the two messages share their
    fields), with its StreamOptions."""
    check_names(options, _STREAM)
    o: dict[str, Any] = dict(options)
    delta_tokens = o.pop("delta_tokens", 0)
    omit_text = o.pop("omit_text", False)
    request: pb.GenerateStreamRequest = pb.GenerateStreamRequest.FromString(
        _generate_request(o).SerializeToString()
    )
    if delta_tokens or omit_text:
        request.stream_options.delta_tokens = delta_tokens
        request.stream_options.omit_text = omit_text
    return request
