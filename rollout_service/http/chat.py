"""POST /v1/chat/completions, up to the pipeline: the body parsed into vLLM's
ChatCompletionRequest, the chat rendered to prompt token ids with vLLM's own
renderer (the model's chat template, or --chat-template; OpenAI messages with
tool calls and tool results, and `tools`, as `vllm serve` renders them),
the settings mapped to a rollout.v1 GenerateRequest. Images (data: URLs in
image_url parts, images.py) go on as the rendered text and gRPC Images, the
GenerateRequest a gRPC chat with images becomes: the pipeline decodes them
and the engine's processor expands each placeholder. All of it runs on the
tokenizing thread (`prepare_chat` is handed to `off_loop`): it grows with
the request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.http import images, reasoning, sampling, tools
from rollout_service.http.body import check_lists, parse_json, validated
from rollout_service.status.errors import InvalidArgument

# The chat route's own fields, served beside sampling.COMMON.
CHAT_FIELDS = sampling.COMMON | {
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "include_reasoning",
}
MAX_VERSION_CHARS = 256


@dataclass
class ChatCall:
    """A chat request ready for the pipeline: vLLM's parsed request (the
    response is built from it), the GenerateRequest, the prompt's ids, the
    tool parser's class (composed with the reasoning parser; None: no
    parser, or none needed) and the reasoning parser's alone (None without
    --reasoning-parser; reasoning.py)."""

    request: Any
    generate: pb.GenerateRequest
    prompt_ids: list[int]
    parser_cls: Any
    reasoning_cls: Any = None

    def ran_on(self, engine_ids: Sequence[int]) -> None:
        """A prompt with images: its ids as the engine ran it (its processor
        expanded each placeholder), once the pipeline answers them; the
        response's prompt_token_ids and prompt_logprobs follow those."""
        if self.generate.images and engine_ids:
            self.prompt_ids = list(engine_ids)


def prepare_chat(raw: bytes, front, app) -> ChatCall:
    """The body as a ChatCall, or InvalidArgument naming what is wrong."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    data = parse_json(raw)
    check_lists(data)
    request: Any = validated(ChatCompletionRequest, data)
    sampling.refuse_unsupported(request, CHAT_FIELDS)
    parser_cls, reasoning_cls, params = chat_settings(request, front, app)
    pictures = images.take_images(
        request.messages, app.info.limits.supports_images, images_per_prompt(app)
    )
    prompt = render_chat(request, app)
    generate = pb.GenerateRequest(
        request_id=request.request_id,
        sampling_params=params,
        lora_adapter=adapter_of(request.model, front, app),
        required_weight_version=required_version(data),
    )
    if pictures:
        # As a gRPC chat with images reaches the engine: the rendered text and
        # the images; the prompt's ids are the engine's (ChatCall.ran_on).
        generate.prompt_text = prompt["prompt"]
        generate.images.extend(pictures)
        return ChatCall(request, generate, [], parser_cls, reasoning_cls)
    ids = prompt_ids(prompt, request, app)
    generate.prompt_token_ids.extend(ids)
    return ChatCall(request, generate, ids, parser_cls, reasoning_cls)


def images_per_prompt(app) -> int:
    """The engine's limit of images a prompt (vLLM's --limit-mm-per-prompt;
    0 for a text-only model)."""
    mm = app.engine.model_config.multimodal_config
    return mm.get_limit_per_prompt("image") if mm is not None else 0


def chat_settings(request, front, app) -> tuple[Any, Any, pb.SamplingParams]:
    """A parsed chat request's tool parser class (None: none needed), its
    reasoning parser class (None: no --reasoning-parser) and its
    SamplingParams (a forced tool call, or response_format, as its
    structured output); a session's turns take them too (session_chat.py)."""
    parser_cls = front.parser_class(app) if tools.auto(request) else None
    if tools.auto(request) and parser_cls is None:
        raise InvalidArgument(
            "tool_choice",
            '"auto" needs a tool parser: start the server with --tool-call-parser, or send '
            'tool_choice "required", "none" or a named function',
        )
    structured = tools.forced_structure(request) or request.extract_structured_outputs()
    reasoning_cls = front.reasoning_class(app)
    reasoning.refuse_hidden(request, reasoning_cls, structured)
    max_tokens = (
        request.max_completion_tokens
        if request.max_completion_tokens is not None
        else request.max_tokens
    )
    top = request.top_logprobs if request.logprobs else None
    return parser_cls, reasoning_cls, sampling.sampling_params(request, max_tokens, top, structured)


def render_chat(request, app) -> dict[str, Any]:
    """The request's messages (and tools) rendered with the chat template by
    vLLM's renderer for the served model, as its prompt: the text, and each
    image's placeholder where its part was (images.take_images emptied
    them: the renderer decodes and fetches nothing)."""
    renderer = app.engine.renderer
    tool_dicts = [t.model_dump() for t in request.tools] if request.tools else None
    chat_params = request.build_chat_params(app.tokenizing.chat_template, "auto").with_defaults(
        {"tools": tool_dicts, "tokenize": False}
    )
    try:
        _, prompt = renderer.render_messages(request.messages, chat_params)
    except (ValueError, TypeError, KeyError) as e:
        # vLLM's message parsing, or the template refusing these messages.
        raise InvalidArgument("messages", str(e)) from e
    except Exception as e:  # jinja2's errors: the template failed on them
        if type(e).__module__.startswith("jinja2"):
            raise InvalidArgument("messages", f"the chat template failed: {e}") from e
        raise
    return prompt


def prompt_ids(prompt: dict[str, Any], request, app) -> list[int]:
    """A rendered prompt's token ids (tokenized by vLLM's renderer)."""
    if "prompt_token_ids" in prompt:
        return list(prompt["prompt_token_ids"])
    tok_params = request.build_tok_params(app.engine.model_config)
    tokens = app.engine.renderer.tokenize_prompt(prompt, tok_params)
    return list(tokens["prompt_token_ids"])


def adapter_of(model: str | None, front, app) -> str:
    """The LoRA adapter a request's `model` names ("" for the base model);
    the pipeline refuses an adapter it does not know."""
    if not model or model in front.model_names(app):
        return ""
    return model


def required_version(data: dict) -> str:
    """The `required_weight_version` extension (docs/openai.md)."""
    value = data.get("required_weight_version", "")
    if not isinstance(value, str) or len(value) > MAX_VERSION_CHARS:
        raise InvalidArgument(
            "required_weight_version", f"a string of at most {MAX_VERSION_CHARS} characters"
        )
    return value
