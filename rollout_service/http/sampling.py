"""An OpenAI request's settings as rollout.v1's SamplingParams: the one form
the pipeline validates and converts (generation/convert.py), whichever front
a request came through. vLLM's protocol model has parsed and checked the
request; this maps its fields, and refuses the fields it would otherwise
drop: a setting that changes the output is served or refused, never
ignored."""

from __future__ import annotations

import json

from rollout.v1 import rollout_pb2 as pb
from rollout_service.status.errors import InvalidArgument

# Fields served on both routes (the route's own are in chat.py and
# completions.py). `user` is accepted and unused, as OpenAI documents it.
COMMON = frozenset(
    {
        "model",
        "n",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "min_tokens",
        "prompt_logprobs",
        "allowed_token_ids",
        "response_format",
        "structured_outputs",
        "stream",
        "stream_options",
        "user",
        "return_token_ids",
        "return_tokens_as_token_ids",
        "request_id",
        "logprobs",
        "max_tokens",
    }
)
_OPTIONAL_FLOATS = (
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)


def refuse_unsupported(request, served: frozenset[str]) -> None:
    """400 naming the first field set to other than its default that this
    front does not serve (beam search, logit bias, ...)."""
    for name in sorted(request.model_fields_set - served):
        field = type(request).model_fields[name]
        if getattr(request, name) != field.get_default(call_default_factory=True):
            raise InvalidArgument(name, "is not supported by this server (docs/openai.md)")


def sampling_params(request, max_tokens: int | None, top_logprobs: int | None, structured):
    """The pb.SamplingParams of a parsed chat or completion request.
    `structured`: vLLM's StructuredOutputsParams for it, or None."""
    sp = pb.SamplingParams()
    if max_tokens is not None:
        if max_tokens < 1:
            raise InvalidArgument("max_tokens", "must be at least 1")
        sp.max_tokens = max_tokens
    for name in _OPTIONAL_FLOATS:
        value = getattr(request, name, None)
        if value is not None:
            setattr(sp, name, value)
    if request.top_k is not None:
        sp.top_k = request.top_k
    if request.seed is not None:
        sp.seed = request.seed
    if request.n is not None:
        if request.n < 1:
            raise InvalidArgument("n", "must be at least 1")
        sp.n = request.n
    if top_logprobs is not None:
        sp.logprobs = top_logprobs
    if request.prompt_logprobs is not None:
        if request.prompt_logprobs < 0:
            raise InvalidArgument("prompt_logprobs", "must be at least 0")
        sp.prompt_logprobs = request.prompt_logprobs
    stop = request.stop
    sp.stop.extend([stop] if isinstance(stop, str) else list(stop or ()))
    sp.stop_token_ids.extend(request.stop_token_ids or ())
    sp.ignore_eos = bool(request.ignore_eos)
    if request.min_tokens:
        sp.min_tokens = request.min_tokens
    sp.allowed_token_ids.extend(request.allowed_token_ids or ())
    if structured is not None:
        sp.structured_output.CopyFrom(structured_output(structured))
    return sp


def structured_output(params) -> pb.StructuredOutput:
    """vLLM's StructuredOutputsParams (what response_format or a forced tool
    call became) as rollout.v1's StructuredOutput."""
    if params.json is not None:
        schema = params.json if isinstance(params.json, str) else json.dumps(params.json)
        return pb.StructuredOutput(json_schema=schema)
    if params.regex is not None:
        return pb.StructuredOutput(regex=params.regex)
    if params.choice is not None:
        return pb.StructuredOutput(choice=pb.StructuredOutput.Choices(choices=params.choice))
    if params.grammar is not None:
        return pb.StructuredOutput(grammar=params.grammar)
    if params.json_object:
        return pb.StructuredOutput(json_object=True)
    raise InvalidArgument("response_format", "this kind of constraint is not supported here")
