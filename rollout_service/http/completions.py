"""POST /v1/completions: a prompt (text or token ids) or a list of them,
parsed into vLLM's CompletionRequest and mapped to one GenerateRequest a
prompt (the pipeline tokenizes text as Generate's prompt_text); and the
answers as one vLLM CompletionResponse, choice `i * n + j` being prompt i's
completion j, as `vllm serve` numbers them. Both run on the tokenizing
thread; batch.py runs a request's prompts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.http import sampling
from rollout_service.http.body import parse_json, validated
from rollout_service.http.chat import adapter_of, required_version
from rollout_service.http.responses import FINISH, prompt_logprobs, token_texts, usage_info
from rollout_service.status.errors import InvalidArgument, short_repr

COMPLETION_FIELDS = sampling.COMMON | {"prompt"}
# Prompts a request: each is a generation of its own, all held until the
# last ends. More than the engine's sequence slots (vLLM's max_num_seqs, 128
# by default) would only queue behind each other; GenerateMany over gRPC
# takes more, within its memory bounds (docs/api.md).
MAX_PROMPTS = 128
# prompt_token_ids are uint32 in rollout.v1; the vocabulary check comes after.
_MAX_ID = (1 << 32) - 1


@dataclass
class CompletionCall:
    """A completion request ready for the pipeline: one GenerateRequest a
    prompt, in the request's order, all under the request's id (Abort by it
    ends every one)."""

    request: Any
    generates: list[pb.GenerateRequest]

    @property
    def request_id(self) -> str:
        return self.generates[0].request_id


def prepare_completion(raw: bytes, front, app) -> CompletionCall:
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    data = parse_json(raw)
    check_prompts(data.get("prompt"))
    request = validated(CompletionRequest, data)
    sampling.refuse_unsupported(request, COMPLETION_FIELDS)
    common = pb.GenerateRequest(
        request_id=request.request_id,
        sampling_params=sampling.sampling_params(
            request, request.max_tokens, request.logprobs, request.extract_structured_outputs()
        ),
        lora_adapter=adapter_of(request.model, front, app),
        required_weight_version=required_version(data),
    )
    generates = []
    for prompt in prompts_of(request.prompt):
        generate = pb.GenerateRequest()
        generate.CopyFrom(common)
        if isinstance(prompt, str):
            generate.prompt_text = prompt
        else:
            generate.prompt_token_ids.extend(prompt)
        generates.append(generate)
    return CompletionCall(request, generates)


def check_prompts(prompt: Any) -> None:
    """The body's `prompt` before vLLM's model reads it (whose union would
    name the wrong member): a list is one prompt of token ids, or at most
    MAX_PROMPTS prompts, all strings or all lists of ids, none empty. A
    string, or anything else, is left to vLLM's model."""
    if not isinstance(prompt, list):
        return
    if not prompt:
        raise InvalidArgument("prompt", "is an empty list")
    if not any(isinstance(p, (str, list)) for p in prompt):
        _check_ids(prompt, "prompt")
        return
    if len(prompt) > MAX_PROMPTS:
        raise InvalidArgument(
            "prompt", f"at most {MAX_PROMPTS} prompts a request, got {len(prompt)}"
        )
    kind = type(prompt[0])
    for i, p in enumerate(prompt):
        if type(p) is not kind or kind not in (str, list):
            raise InvalidArgument(
                f"prompt[{i}]",
                "a list of prompts holds strings only, or lists of token ids only",
            )
        if not p:
            raise InvalidArgument(f"prompt[{i}]", "is empty")
        if isinstance(p, list):
            _check_ids(p, f"prompt[{i}]")


def _check_ids(ids: list, field: str) -> None:
    for j, t in enumerate(ids):
        if type(t) is not int or not 0 <= t <= _MAX_ID:
            raise InvalidArgument(
                f"{field}[{j}]", f"a token id (a whole number from 0), got {short_repr(t)}"
            )


def prompts_of(prompt: str | list) -> list[str | list[int]]:
    """The request's prompts, as vLLM's model parsed them."""
    if isinstance(prompt, str) or all(type(t) is int for t in prompt):
        return [prompt]
    return list(prompt)


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


def summed(usages) -> pb.Usage:
    """The usage of several generations, as one."""
    total = pb.Usage()
    for u in usages:
        total.prompt_tokens += u.prompt_tokens
        total.completion_tokens += u.completion_tokens
        total.cached_prompt_tokens += u.cached_prompt_tokens
    return total


def one_version(versions) -> str:
    """The weight version every prompt's tokens were admitted on, or "" when
    an update landed between their admissions: no version is claimed for
    the tokens of another, and each choice says its own (docs/openai.md)."""
    distinct = set(versions)
    return distinct.pop() if len(distinct) == 1 else ""


def completion_response(call: CompletionCall, answers: list[pb.GenerateResponse], model: str, app):
    """One CompletionResponse for the answers to the call's prompts, in order."""
    from vllm.entrypoints.openai.completion.protocol import (
        CompletionResponse,
        CompletionResponseChoice,
    )

    request = call.request
    text = token_texts(app.tokenizing, bool(request.return_tokens_as_token_ids))
    choices = []
    for i, (generate, response) in enumerate(zip(call.generates, answers)):
        # The prompt's token ids: as sent, or as the server tokenized them.
        ids = list(generate.prompt_token_ids or response.prompt_token_ids)
        choices += [
            CompletionResponseChoice(
                index=i * request.n + c.index,
                text=c.text,
                logprobs=completion_logprobs(c.token_ids, c.logprobs, c.top_logprobs, text)
                if request.logprobs is not None
                else None,
                finish_reason=FINISH.get(c.finish_reason),
                stop_reason=c.stop_reason or None,
                token_ids=list(c.token_ids) if request.return_token_ids else None,
                prompt_token_ids=ids if request.return_token_ids else None,
                prompt_logprobs=prompt_logprobs(ids, response, text),
                weight_version=response.weight_version,
            )
            for c in response.completions
        ]
    return CompletionResponse(
        id=f"cmpl-{call.request_id}",
        model=model,
        choices=choices,
        usage=usage_info(summed(a.usage for a in answers)),
        weight_version=one_version(a.weight_version for a in answers),
    )
