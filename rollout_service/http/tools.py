"""Tool calls: forced by structured output, found by vLLM's tool parsers.

tool_choice "required" or a named function constrains the output to vLLM's
own JSON schema for it (`get_json_schema_from_tools`: an array of
{"name", "parameters"} objects, or the named function's parameters), as
`vllm serve` does for every parser that takes its standard path; so any
model, a random-weight one included, makes a call that parses, and no tool
parser is needed. Reading the call back is that path's too (vLLM's
DelegatingParser._extract_tool_calls, restated here because it runs only
inside a parser): the named function's arguments are the output, the
required array is validated as a list of FunctionDefinition.

tool_choice "auto" leaves the output free; the parser named by
--tool-call-parser (vLLM's ParserManager) finds calls in it.
"""

from __future__ import annotations

import contextlib
import json

from pydantic import TypeAdapter, ValidationError

from rollout_service.status.errors import InvalidArgument


def named(request) -> str | None:
    """The function a named tool_choice forces, or None."""
    choice = request.tool_choice
    function = getattr(choice, "function", None)
    return function.name if function is not None else None


def forced(request) -> bool:
    return bool(request.tools) and (request.tool_choice == "required" or named(request) is not None)


def auto(request) -> bool:
    return bool(request.tools) and request.tool_choice in ("auto", None)


def forced_structure(request):
    """vLLM's StructuredOutputsParams that force the request's tool call,
    or None when no call is forced."""
    if not forced(request):
        return None
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    try:
        schema = get_json_schema_from_tools(
            request.tool_choice, request.tools, request.parallel_tool_calls
        )
    except ValueError as e:  # a named function not in `tools`
        raise InvalidArgument("tool_choice", str(e)) from e
    return StructuredOutputsParams(json=schema)


def forced_calls(request, text: str) -> list:
    """The calls a forced output holds, as vLLM's FunctionCall."""
    from vllm.entrypoints.generate.base.protocol import FunctionCall, FunctionDefinition

    name = named(request)
    if name is not None:
        return [FunctionCall(name=name, arguments=text)] if text.strip() else []
    calls = []
    # Cut short (max_tokens) it does not parse: no calls, as in vLLM.
    with contextlib.suppress(ValidationError):
        calls = TypeAdapter(list[FunctionDefinition]).validate_json(text or "")
    return [
        FunctionCall(name=c.name, arguments=json.dumps(c.parameters, ensure_ascii=False))
        for c in calls
    ]


def tool_calls(functions) -> list:
    """vLLM's ToolCall (with a fresh id) for each FunctionCall."""
    from vllm.entrypoints.generate.base.protocol import ToolCall
    from vllm.renderers.chat_utils import make_tool_call_id

    return [ToolCall(id=f.id or make_tool_call_id(), function=f) for f in functions]
