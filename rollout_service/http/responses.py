"""rollout.v1 generation results as vLLM's OpenAI response models: what the
pipeline answered (pb.GenerateResponse, or a stream's deltas in
streaming.py), never an engine output read around it. Pure functions of the
pb message, the parsed request and a token-text function; they grow with the
response, so the routes run them on the tokenizing thread.

Extensions (docs/openai.md): every response carries `weight_version` (the
version that produced its tokens, as GenerateResponse.weight_version); with
`return_token_ids` the prompt's and each choice's token ids (vLLM's names);
with `prompt_logprobs` the prompt's, in vLLM's shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rollout.v1 import rollout_pb2 as pb
from rollout_service.http import reasoning, tools

FINISH = {
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_ABORT: "abort",
}

TokenText = Callable[[int], str]


def token_texts(tokenizing, as_ids: bool) -> TokenText:
    """A token id's text as OpenAI's logprobs show it (`token_id:N` with
    vLLM's return_tokens_as_token_ids), memoized for one response."""
    cache: dict[int, str] = {}

    def text(token_id: int) -> str:
        if as_ids:
            return f"token_id:{token_id}"
        if token_id not in cache:
            cache[token_id] = tokenizing.decode([token_id], skip_special_tokens=False)
        return cache[token_id]

    return text


def chat_logprobs(ids: Sequence[int], logprobs, tops, top_n: int, text: TokenText):
    """vLLM's ChatCompletionLogProbs for these tokens."""
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionLogProb,
        ChatCompletionLogProbs,
        ChatCompletionLogProbsContent,
    )

    content = []
    for i, (token_id, logprob) in enumerate(zip(ids, logprobs)):
        t = text(token_id)
        top = tops[i] if i < len(tops) else None
        alternatives = (
            [
                ChatCompletionLogProb(token=text(a), logprob=lp, bytes=list(text(a).encode()))
                for a, lp in zip(top.token_ids[:top_n], top.logprobs[:top_n])
            ]
            if top is not None
            else []
        )
        content.append(
            ChatCompletionLogProbsContent(
                token=t, logprob=logprob, bytes=list(t.encode()), top_logprobs=alternatives
            )
        )
    return ChatCompletionLogProbs(content=content)


def usage_info(usage: pb.Usage):
    from vllm.entrypoints.serve.engine.protocol import PromptTokenUsageInfo, UsageInfo

    return UsageInfo(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
        prompt_tokens_details=PromptTokenUsageInfo(cached_tokens=usage.cached_prompt_tokens),
    )


def prompt_logprobs(prompt_ids: Sequence[int], response, text: TokenText) -> list | None:
    """vLLM's prompt_logprobs: None for the first token, then a dict of the
    token's logprob and its top alternatives by id."""
    if not response.prompt_logprobs:
        return None
    from vllm.logprobs import Logprob

    out: list = [None]
    tops = response.prompt_top_logprobs
    for i, logprob in enumerate(response.prompt_logprobs):
        token_id = prompt_ids[i + 1]
        entry = {token_id: Logprob(logprob, decoded_token=text(token_id))}
        if i < len(tops):
            for a, lp in zip(tops[i].token_ids, tops[i].logprobs):
                entry.setdefault(a, Logprob(lp, decoded_token=text(a)))
        out.append(entry)
    return out


def chat_message(call, c, app) -> tuple:
    """One completion's ChatMessage, and whether it called tools: its
    reasoning split off (--reasoning-parser; dropped with include_reasoning
    false), a forced call read back from its JSON, an auto one found by the
    tool parser, both in the content only (reasoning.py)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatMessage

    thought, content, calls = reasoning.parsed(call, c.text, c.token_ids, app)
    if not call.request.include_reasoning:
        thought = None
    message = ChatMessage(role="assistant", content=content, reasoning=thought, tool_calls=calls)
    return message, bool(calls)


def finish_reason(request, c, called: bool) -> str | None:
    """OpenAI's: "tool_calls" when "required" (or "auto") called a tool,
    "stop" for a named function, as vLLM answers."""
    reason = FINISH.get(c.finish_reason)
    if called and (request.tool_choice == "required" or tools.auto(request)) and reason == "stop":
        return "tool_calls"
    return reason


def chat_response(call, response: pb.GenerateResponse, model: str, app):
    """vLLM's ChatCompletionResponse for the pipeline's answer."""
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionResponse,
        ChatCompletionResponseChoice,
    )

    request = call.request
    call.ran_on(response.prompt_token_ids)
    text = token_texts(app.tokenizing, bool(request.return_tokens_as_token_ids))
    choices = []
    for c in response.completions:
        message, called = chat_message(call, c, app)
        logprobs = (
            chat_logprobs(c.token_ids, c.logprobs, c.top_logprobs, request.top_logprobs or 0, text)
            if request.logprobs
            else None
        )
        choices.append(
            ChatCompletionResponseChoice(
                index=c.index,
                message=message,
                logprobs=logprobs,
                finish_reason=finish_reason(request, c, called),
                stop_reason=c.stop_reason or None,
                token_ids=list(c.token_ids) if request.return_token_ids else None,
            )
        )
    return ChatCompletionResponse(
        id=f"chatcmpl-{response.request_id}",
        model=model,
        choices=choices,
        usage=usage_info(response.usage),
        prompt_token_ids=call.prompt_ids if request.return_token_ids else None,
        prompt_logprobs=prompt_logprobs(call.prompt_ids, response, text),
        weight_version=response.weight_version,
    )
