"""verl's sampling parameters as the service's: what verl's agent loop and
its vLLM server agree on (max_tokens from the response length when verl
sends none), and the global step a pushed version names. Pure functions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# verl's sampling_params keys and ours (SamplingParams fields).
_SAME = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "min_tokens",
    "stop",
    "stop_token_ids",
    "ignore_eos",
)
# vLLM SamplingParams fields with no counterpart that change no token id:
# dropped (the service returns ids and, once decoded, text).
_IGNORED = (
    "detokenize",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "output_kind",
)


def step_of(version: str, prefix: str | None) -> int | None:
    """The global step a version pushed under `prefix` names (None: another's)."""
    if prefix is None or not version.startswith(prefix):
        return None
    tail = version[len(prefix) :]
    return int(tail) if tail.isdigit() else None


def sampling_kwargs(
    params: Mapping[str, Any],
    prompt_len: int,
    config: Any,
    max_model_len: int = 0,
    seed: int | None = None,
) -> tuple[dict[str, Any], bool]:
    """verl's sampling_params as Generate's keyword arguments, and whether
    logprobs were asked for. max_tokens defaults as verl's vLLM server sets
    it: the response length, within prompt_length + response_length and the
    served context."""
    p = dict(params)
    max_tokens = p.pop("max_tokens", p.pop("max_new_tokens", None))
    if max_tokens is None:
        response_length = int(config.response_length)
        max_tokens = min(response_length, int(config.prompt_length) + response_length - prompt_len)
    if max_model_len:
        max_tokens = min(max_tokens, max_model_len - prompt_len)
    want_logprobs = bool(p.pop("logprobs", False))
    n = p.pop("n", 1)
    if n != 1:
        raise ValueError(f"rollout_service: verl asks one completion per call, not n={n}")
    out: dict[str, Any] = {"max_tokens": max(1, int(max_tokens))}
    out["repetition_penalty"] = p.pop(
        "repetition_penalty", getattr(config, "repetition_penalty", None) or 1.0
    )
    out["ignore_eos"] = bool(p.pop("ignore_eos", getattr(config, "ignore_eos", False)))
    if seed is not None:
        p.setdefault("seed", seed)
    for key in _SAME:
        if key in p and p[key] is not None:
            out[key] = p.pop(key)
    for key in _IGNORED:
        p.pop(key, None)
    if p:
        raise TypeError(f"rollout_service: unsupported sampling parameter(s): {sorted(p)}")
    if "stop" in out:
        out["stop"] = [out["stop"]] if isinstance(out["stop"], str) else list(out["stop"])
    if want_logprobs:
        out["logprobs"] = 0  # the sampled token's own logprob is always returned
    return out, want_logprobs
