"""POST /v1/completions: one prompt, text or token ids, parsed into vLLM's
CompletionRequest and mapped to a GenerateRequest (the pipeline tokenizes
text as Generate's prompt_text); and the answer as vLLM's
CompletionResponse. Both run on the tokenizing thread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.http import sampling
from rollout_service.http.body import parse_json, validated
from rollout_service.http.chat import adapter_of, required_version
from rollout_service.http.responses import FINISH, prompt_logprobs, token_texts, usage_info
from rollout_service.status.errors import InvalidArgument

COMPLETION_FIELDS = sampling.COMMON | {"prompt"}


@dataclass
class CompletionCall:
    """A completion request ready for the pipeline."""

    request: Any
    generate: pb.GenerateRequest


def prepare_completion(raw: bytes, front, app) -> CompletionCall:
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    data = parse_json(raw)
    request = validated(CompletionRequest, data)
    sampling.refuse_unsupported(request, COMPLETION_FIELDS)
    prompt = request.prompt
    # One prompt a request: a batch is many requests (send them at once).
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    generate = pb.GenerateRequest(
        request_id=request.request_id,
        sampling_params=sampling.sampling_params(
            request, request.max_tokens, request.logprobs, request.extract_structured_outputs()
        ),
        lora_adapter=adapter_of(request.model, front, app),
        required_weight_version=required_version(data),
    )
    if isinstance(prompt, str):
        generate.prompt_text = prompt
    elif isinstance(prompt, list) and all(type(t) is int for t in prompt):
        generate.prompt_token_ids.extend(prompt)
    else:
        raise InvalidArgument("prompt", "one prompt a request: a string or a list of token ids")
    return CompletionCall(request, generate)


def prompt_ids(call: CompletionCall, response) -> list[int]:
    """The prompt's token ids: as sent, or as the server tokenized them."""
    return list(call.generate.prompt_token_ids or response.prompt_token_ids)


def completion_logprobs(ids, logprobs, tops, text, offset: int = 0):
    """vLLM's CompletionLogProbs (the legacy shape: tokens, their logprobs,
    the top alternatives by text, each token's character offset)."""
    from vllm.entrypoints.openai.completion.protocol import CompletionLogProbs

    out = CompletionLogProbs()
    for i, (token_id, logprob) in enumerate(zip(ids, logprobs)):
        t = text(token_id)
        out.tokens.append(t)
        out.token_logprobs.append(logprob)
        out.text_offset.append(offset)
        offset += len(t)
        top = {t: logprob}
        if i < len(tops):
            for a, lp in zip(tops[i].token_ids, tops[i].logprobs):
                top.setdefault(text(a), lp)
        out.top_logprobs.append(top)
    return out


def completion_response(call: CompletionCall, response: pb.GenerateResponse, model: str, app):
    from vllm.entrypoints.openai.completion.protocol import (
        CompletionResponse,
        CompletionResponseChoice,
    )

    request = call.request
    text = token_texts(app.tokenizing, bool(request.return_tokens_as_token_ids))
    ids = prompt_ids(call, response)
    choices = [
        CompletionResponseChoice(
            index=c.index,
            text=c.text,
            logprobs=completion_logprobs(c.token_ids, c.logprobs, c.top_logprobs, text)
            if request.logprobs is not None
            else None,
            finish_reason=FINISH.get(c.finish_reason),
            stop_reason=c.stop_reason or None,
            token_ids=list(c.token_ids) if request.return_token_ids else None,
            prompt_token_ids=ids if request.return_token_ids else None,
            prompt_logprobs=prompt_logprobs(ids, response, text),
        )
        for c in response.completions
    ]
    return CompletionResponse(
        id=f"cmpl-{response.request_id}",
        model=model,
        choices=choices,
        usage=usage_info(response.usage),
        weight_version=response.weight_version,
    )
