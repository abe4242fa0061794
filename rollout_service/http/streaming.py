"""A stream's deltas (pb.GenerateStreamResponse, as GenerateStream sends
them) as OpenAI's server-sent events: vLLM's chunk models, one `data:` line
each, `data: [DONE]` at the end.

Chat: each choice opens with its role; content follows as it comes, or, for
an "auto" tool choice with a parser or under --reasoning-parser, as vLLM's
parser streams it (`parse_delta`: the reasoning in `reasoning`, then the
content; reasoning.py); a forced tool call is sent whole with the choice's
last delta (its JSON only parses once complete). With stream_options.include_usage
a last chunk carries the usage (summed over a completion request's prompts).
Every chunk carries `weight_version` (the delta's: a PAUSE_MODE_KEEP update
may move it on mid-stream, and a completion request's prompts may have been
admitted on different versions).
"""

from __future__ import annotations

import json
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.http import reasoning, tools
from rollout_service.http.completions import completion_logprobs, summed
from rollout_service.http.responses import FINISH, chat_logprobs, token_texts, usage_info


def sse(model) -> str:
    return f"data: {model.model_dump_json(exclude_unset=False, exclude_none=True)}\n\n"


DONE = "data: [DONE]\n\n"


def sse_error(body: dict) -> str:
    """An error after the stream began (errors.py's body), then [DONE]."""
    return f"data: {json.dumps(body)}\n\n{DONE}"


class _Events:
    """What both streams share: the usage the last delta of each prompt
    carries, and the end (their sum in a usage chunk when
    stream_options.include_usage asks, then [DONE]). A subclass makes its
    route's chunk (`_chunk`)."""

    call: Any
    usages: dict[int, pb.Usage]

    def _chunk(self, choices, version: str, **extra):
        raise NotImplementedError

    def _keep_usage(self, d: pb.GenerateStreamResponse, prompt: int = 0) -> None:
        if d.HasField("usage"):
            self.usages[prompt] = d.usage

    def end(self, version: str) -> list[str]:
        """The usage chunk (when asked for) and [DONE]."""
        options = self.call.request.stream_options
        events = []
        if options is not None and options.include_usage and self.usages:
            usage = usage_info(summed(self.usages.values()))
            events.append(sse(self._chunk([], version, usage=usage)))
        return [*events, DONE]


class ChatStream(_Events):
    """One chat request's chunks, built delta by delta (`step`); its state
    (a parser per choice, a forced call's text so far) lives here."""

    def __init__(self, call, model: str, app, request_id: str) -> None:
        self.call, self.model, self.app = call, model, app
        self.id = f"chatcmpl-{request_id}"
        self.usages = {}
        request = call.request
        self.text = token_texts(app.tokenizing, bool(request.return_tokens_as_token_ids))
        self.opened: set[int] = set()
        self.forced_text: dict[int, str] = {}
        self.parsers: dict[int, Any] = {}  # vLLM tool parsers, one per choice

    def _chunk(self, choices, version: str, **extra):
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionStreamResponse

        return ChatCompletionStreamResponse(
            id=self.id, model=self.model, choices=choices, weight_version=version, **extra
        )

    def _parser(self, index: int, parser_cls):
        """The choice's vLLM parser (its stream's state lives in it)."""
        parser = self.parsers.get(index)
        if parser is None:
            parser = self.parsers[index] = reasoning.make(parser_cls, self.call.request, self.app)
        return parser

    def _parse(self, d: pb.GenerateStreamResponse, parser_cls):
        return self._parser(d.index, parser_cls).parse_delta(
            d.text,
            list(d.token_ids),
            self.call.request,
            self.call.prompt_ids,
            finished=bool(d.finish_reason),
        )

    def _delta(self, d: pb.GenerateStreamResponse):
        """The DeltaMessage for one delta's text (None: nothing to send yet)."""
        from vllm.entrypoints.generate.base.protocol import (
            DeltaFunctionCall,
            DeltaMessage,
            DeltaToolCall,
        )

        request, finished = self.call.request, bool(d.finish_reason)
        if tools.forced(request):
            # The call is read from the content, after any reasoning, which
            # streams as it comes.
            thought, text = None, d.text
            if self.call.reasoning_cls is not None:
                split = self._parse(d, self.call.reasoning_cls)
                thought = split.reasoning if split is not None else None
                text = (split.content or "") if split is not None else ""
            self.forced_text[d.index] = self.forced_text.get(d.index, "") + text
            if not finished:
                return DeltaMessage(reasoning=thought) if thought else None
            calls = tools.tool_calls(tools.forced_calls(request, self.forced_text[d.index]))
            return DeltaMessage(
                reasoning=thought,
                tool_calls=[
                    DeltaToolCall(
                        index=i,
                        id=c.id,
                        type="function",
                        function=DeltaFunctionCall(
                            name=c.function.name, arguments=c.function.arguments
                        ),
                    )
                    for i, c in enumerate(calls)
                ],
            )
        if self.call.parser_cls is not None:
            return self._parse(d, self.call.parser_cls)
        if self.call.reasoning_cls is not None:
            return self._parse(d, self.call.reasoning_cls)
        return DeltaMessage(content=d.text)

    def step(self, d: pb.GenerateStreamResponse) -> list[str]:
        """The events for one delta."""
        from vllm.entrypoints.generate.base.protocol import DeltaMessage
        from vllm.entrypoints.openai.chat_completion.protocol import (
            ChatCompletionResponseStreamChoice,
        )

        request = self.call.request
        self.call.ran_on(d.prompt_token_ids)  # the first delta's, with images
        events = []
        if d.index not in self.opened:
            self.opened.add(d.index)
            first = {}
            if request.return_token_ids and not self.opened - {d.index}:
                first["prompt_token_ids"] = self.call.prompt_ids
            choice = ChatCompletionResponseStreamChoice(
                index=d.index, delta=DeltaMessage(role="assistant", content="")
            )
            events.append(sse(self._chunk([choice], d.weight_version, **first)))
        delta = self._delta(d)
        reason = FINISH.get(d.finish_reason)
        # A token a parser holds back (</think>, tool-call markup) still has
        # its logprob and id sent when asked for, as vLLM sends them.
        if delta is None and reason is None and not (request.logprobs or request.return_token_ids):
            return events
        called = bool(delta is not None and delta.tool_calls)
        if called and reason == "stop" and not tools.named(request):
            reason = "tool_calls"
        logprobs = (
            chat_logprobs(d.token_ids, d.logprobs, d.top_logprobs, request.top_logprobs, self.text)
            if request.logprobs
            else None
        )
        choice = ChatCompletionResponseStreamChoice(
            index=d.index,
            delta=delta or DeltaMessage(),
            logprobs=logprobs,
            finish_reason=reason,
            stop_reason=d.stop_reason or None,
            token_ids=list(d.token_ids) if request.return_token_ids else None,
        )
        events.append(sse(self._chunk([choice], d.weight_version)))
        self._keep_usage(d)
        return events


class CompletionStream(_Events):
    """One completion request's chunks (vLLM's CompletionStreamResponse), its
    prompts' messages interleaved as they come, each message's index already
    its choice's in the response (batch.merged: prompt i's completion j is
    i * n + j)."""

    def __init__(self, call, model: str, app, request_id: str) -> None:
        self.call, self.model = call, model
        self.id = f"cmpl-{request_id}"
        request = call.request
        self.n = request.n
        self.text = token_texts(app.tokenizing, bool(request.return_tokens_as_token_ids))
        # Each prompt's ids: as sent, or as the first message of its stream says.
        self.prompt_ids = [list(g.prompt_token_ids) for g in call.generates]
        self.offsets: dict[int, int] = {}
        self.usages = {}

    def _chunk(self, choices, version: str, **extra):
        from vllm.entrypoints.openai.completion.protocol import CompletionStreamResponse

        return CompletionStreamResponse(
            id=self.id, model=self.model, choices=choices, weight_version=version, **extra
        )

    def step(self, d: pb.GenerateStreamResponse) -> list[str]:
        from vllm.entrypoints.openai.completion.protocol import CompletionResponseStreamChoice

        request = self.call.request
        prompt = d.index // self.n
        if d.prompt_token_ids and not self.prompt_ids[prompt]:
            self.prompt_ids[prompt] = list(d.prompt_token_ids)
        first = d.index not in self.offsets
        offset = self.offsets.get(d.index, 0)
        logprobs = (
            completion_logprobs(d.token_ids, d.logprobs, d.top_logprobs, self.text, offset)
            if request.logprobs is not None
            else None
        )
        self.offsets[d.index] = offset + len(d.text)
        ids = self.prompt_ids[prompt]
        choice = CompletionResponseStreamChoice(
            index=d.index,
            text=d.text,
            logprobs=logprobs,
            finish_reason=FINISH.get(d.finish_reason),
            stop_reason=d.stop_reason or None,
            token_ids=list(d.token_ids) if request.return_token_ids else None,
            prompt_token_ids=ids if request.return_token_ids and first else None,
        )
        self._keep_usage(d, prompt)
        return [sse(self._chunk([choice], d.weight_version))]
