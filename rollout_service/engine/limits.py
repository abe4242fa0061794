"""The model's limits every request is validated against, read once from
the engine at start-up (startup.engine_info) and used by the converters."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelLimits:
    """What a request is validated against, read once from the engine."""

    vocab_size: int
    max_model_len: int
    max_logprobs: int
    supports_images: bool
    # Longest prompt accepted (--max-prompt-tokens); None: the context allows.
    max_prompt_tokens: int | None = None
