"""The served tokenizer: text and chat messages to token ids, ids to text, and
the facts a client needs to build prompts itself (GetServerInfo.tokenizer).

Chat messages are rendered with the model's own chat template (Hugging Face's
`apply_chat_template`). A message whose parts are all text is given to the
template as one string (what text-only templates expect); one with images as
a list of `{"type": "text"|"image"}` parts (what multimodal templates and
processors expect), the images themselves travelling beside the prompt.

Tokenizing and rendering grow with the input, so they never run on the event
loop: the servicer hands them to this module's own thread (`off_loop`; one
thread, because a Hugging Face fast tokenizer must not be used by two threads
at once). Hugging Face's Rust tokenizer releases the GIL while it encodes, so
health checks and streams go on meanwhile. And a text too long to be a prompt
is refused before it is tokenized at all: no token covers more characters
than the longest entry of the vocabulary (`min_tokens`).
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.generation.chat_entries import tool_fields
from rollout_service.status.errors import InvalidArgument

if TYPE_CHECKING:
    from rollout_service.engine.protocol import Engine


@dataclass
class RenderedChat:
    """A chat rendered to prompt text, with the images its parts carried."""

    text: str
    images: list[pb.Image] = field(default_factory=list)


def conversation_of(
    messages: Sequence[pb.ChatMessage], field_name: str
) -> tuple[RenderedChat, list[dict[str, Any]]]:
    """The messages as a Hugging Face conversation, and their images."""
    conversation: list[dict[str, Any]] = []
    images: list[pb.Image] = []
    for i, m in enumerate(messages):
        if not m.role:
            raise InvalidArgument(f"{field_name}[{i}].role", "must not be empty")
        parts: list[dict[str, Any]] = []
        for j, part in enumerate(m.content):
            kind = part.WhichOneof("part")
            if kind is None:
                raise InvalidArgument(f"{field_name}[{i}].content[{j}]", "must set text or image")
            if kind == "image":
                images.append(part.image)
                parts.append({"type": "image"})
            else:
                parts.append({"type": "text", "text": part.text})
        entry: dict[str, Any]
        if any(p["type"] == "image" for p in parts):
            entry = {"role": m.role, "content": parts}
        else:
            entry = {"role": m.role, "content": "".join(p["text"] for p in parts)}
        conversation.append(entry | tool_fields(m, f"{field_name}[{i}]"))
    return RenderedChat(text="", images=images), conversation


class Tokenizing:
    """Tokenization on the served model's tokenizer (None: the model has none)."""

    def __init__(
        self,
        tokenizer,
        eos_token_ids: Sequence[int] = (),
        image_placeholder: str = "",
        chat_template: str | None = None,
    ):
        self.tokenizer = tokenizer
        # --chat-template: replaces the model's own.
        self.chat_template = chat_template
        self._eos = sorted(set(eos_token_ids))
        self.image_placeholder = image_placeholder
        self.max_token_chars = _longest_token(tokenizer)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="tokenizing")

    async def off_loop(self, fn: Callable, *args):
        """`fn(*args)` on the tokenizing thread, awaited from the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, functools.partial(fn, *args))

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)

    def min_tokens(self, chars: int) -> int:
        """The fewest tokens a text of `chars` characters can make (0 when
        unknown): a token covers at most `max_token_chars` of them. Byte-level
        vocabularies hold each token's bytes, and a character is at least one
        byte; a WordPiece-style unknown token covering a whole word would break
        this, and no served LLM tokenizer has one."""
        return math.ceil(chars / self.max_token_chars) if self.max_token_chars else 0

    def _require(self, field_name: str):
        if self.tokenizer is None:
            raise InvalidArgument(field_name, "the model has no tokenizer; send token ids")
        return self.tokenizer

    @property
    def has_chat_template(self) -> bool:
        return self.tokenizer is not None and bool(
            self.chat_template or getattr(self.tokenizer, "chat_template", None)
        )

    def encode(self, text: str, field_name: str, add_special_tokens: bool = True) -> list[int]:
        return self._require(field_name).encode(text, add_special_tokens=add_special_tokens)

    def render(
        self,
        messages: Sequence[pb.ChatMessage],
        options: pb.ChatOptions,
        field_name: str = "messages",
    ) -> RenderedChat:
        """Renders chat messages to prompt text with the chat template."""
        rendered, conversation = conversation_of(messages, field_name)
        cont = options.continue_final_message
        if cont and messages[-1].role != "assistant":
            raise InvalidArgument(
                "chat_options.continue_final_message",
                f"the last message must be the assistant's to continue, got {messages[-1].role!r}",
            )
        rendered.text = self.render_conversation(
            conversation, field_name, add_generation_prompt=not cont, continue_final_message=cont
        )
        return rendered

    def render_conversation(
        self,
        conversation: list[dict[str, Any]],
        field_name: str,
        add_generation_prompt: bool,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """A Hugging Face conversation rendered to text with the chat template
        (--chat-template's, else the model's)."""
        tokenizer = self._require(field_name)
        if not self.has_chat_template:
            raise InvalidArgument(
                field_name, "the model's tokenizer has no chat template; send prompt_text"
            )
        try:
            return tokenizer.apply_chat_template(
                conversation,
                tools=tools,
                chat_template=self.chat_template,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
            )
        except Exception as e:  # jinja2 errors: the template refused these messages
            raise InvalidArgument(field_name, f"the chat template failed: {e}") from e

    def chat_ids(self, rendered: RenderedChat, field_name: str = "messages") -> list[int]:
        """Token ids of a rendered chat: the template already placed every
        special token, so none are added."""
        return self.encode(rendered.text, field_name, add_special_tokens=False)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool) -> str:
        return self._require("token_ids").decode(
            list(token_ids), skip_special_tokens=skip_special_tokens
        )

    def info(self) -> pb.TokenizerInfo:
        """GetServerInfo.tokenizer."""
        info = pb.TokenizerInfo(eos_token_ids=self._eos, has_chat_template=self.has_chat_template)
        tok = self.tokenizer
        if tok is None:
            return info
        for name in ("bos_token_id", "pad_token_id"):
            value = getattr(tok, name, None)
            if isinstance(value, int):
                setattr(info, name, value)
        if self.image_placeholder:
            info.image_placeholder = self.image_placeholder
            image_id = tok.convert_tokens_to_ids(self.image_placeholder)
            if isinstance(image_id, int) and image_id != getattr(tok, "unk_token_id", None):
                info.image_token_id = image_id
        return info


def _longest_token(tokenizer) -> int:
    """Characters of the longest vocabulary entry, special tokens included
    (0: no tokenizer, or one that cannot list its vocabulary)."""
    try:
        return max(map(len, tokenizer.get_vocab())) if tokenizer is not None else 0
    except Exception:
        return 0


def eos_token_ids(engine: Engine, tokenizer) -> list[int]:
    """The tokenizer's eos id and the generation config's (which may list several)."""
    ids = set()
    if tokenizer is not None and isinstance(getattr(tokenizer, "eos_token_id", None), int):
        ids.add(tokenizer.eos_token_id)
    try:
        generation = engine.model_config.try_get_generation_config() or {}
    except Exception:
        generation = {}
    eos = generation.get("eos_token_id")
    ids.update([eos] if isinstance(eos, int) else (eos or []))
    return sorted(ids)


def image_placeholder(engine: Engine) -> str:
    """The multimodal model's image placeholder text ("" for text models)."""
    mc = engine.model_config
    if not mc.is_multimodal_model:
        return ""
    hf = mc.hf_config
    tokenizer = engine.get_tokenizer()
    index = getattr(hf, "image_token_index", None) or getattr(hf, "image_token_id", None)
    if tokenizer is not None and isinstance(index, int):
        return tokenizer.convert_ids_to_tokens(index)
    return ""
