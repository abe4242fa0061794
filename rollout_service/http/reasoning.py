"""Reasoning and tool calls read out of a chat completion's text, with vLLM's
own parsers (`vllm serve`'s): --reasoning-parser splits the reasoning off
(vLLM's ReasoningParserManager, composed by its ParserManager), then tool
calls are read from the content only, as vLLM's DelegatingParser does.

Which parser a request takes: tool_choice "auto" the tool parser composed
with the reasoning parser (Front.parser_class); every other request the
reasoning parser alone (Front.reasoning_class), a forced call then read
from the content after the reasoning (the engine constrains only that:
vLLM's structured outputs start once the reasoning ends). Without
--reasoning-parser nothing is split and the text is the content, as before.

`include_reasoning: false` drops the reasoning from the message, as vLLM
does. Not what was sampled: vLLM then constrains structured output from the
first token (the engine's `reasoning_ended`), which a generation of the
pipeline cannot ask for, so that combination is refused (`refuse_hidden`).
The token ids and logprobs a request asks for still cover every sampled
token, the reasoning's included (vLLM hides them; a trainer needs them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rollout_service.http import tools
from rollout_service.status.errors import InvalidArgument


def refuse_hidden(request, reasoning_cls, structured) -> None:
    """400 naming include_reasoning when it is false with a structured
    output under a reasoning parser (module docstring)."""
    if reasoning_cls is not None and structured is not None and not request.include_reasoning:
        raise InvalidArgument(
            "include_reasoning",
            "false with a structured output (a forced tool call, response_format, "
            "structured_outputs) would constrain the output from its first token, which this "
            "server does not do: the constraint starts after the reasoning. Send "
            "include_reasoning true and drop the reasoning from the message yourself",
        )


def make(parser_cls, request, app):
    """One request's (or stream choice's) parser of `parser_cls`, given the
    chat template's options, as `vllm serve` makes it (some parsers read
    `enable_thinking` there)."""
    kwargs = request.build_chat_params(None, "auto").chat_template_kwargs
    return parser_cls(
        app.tokenizing.tokenizer,
        request.tools,
        model_config=app.engine.model_config,
        chat_template_kwargs=kwargs,
    )


def parsed(call, text: str, ids: Sequence[int], app) -> tuple[str | None, str | None, list[Any]]:
    """A completion's reasoning (None: none, or no reasoning parser), its
    content and its tool calls (vLLM's ToolCall, each with an id)."""
    request = call.request
    if call.parser_cls is not None:
        parser = make(call.parser_cls, request, app)
        thought, content, found = parser.parse(
            text, request, enable_auto_tools=True, model_output_token_ids=list(ids)
        )
        return thought, content, tools.tool_calls(found or [])
    thought, content = None, text
    if call.reasoning_cls is not None:
        parser = make(call.reasoning_cls, request, app)
        thought, content, _ = parser.parse(text, request, model_output_token_ids=list(ids))
    if tools.forced(request):
        return thought, "", tools.tool_calls(tools.forced_calls(request, content or ""))
    return thought, content, []
