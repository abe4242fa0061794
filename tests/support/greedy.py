"""What two servers serve, compared: greedy tokens and their logprobs for a
few prompts (the delta tests' check that a push serves what a full push of
the same weights serves on a fresh engine)."""

from __future__ import annotations

import numpy as np

from rollout_client import RolloutClient

PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [40, 41, 42, 43], list(range(100, 164))]


def served(c: RolloutClient) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    """Greedy tokens and their logprobs for every prompt."""
    out = []
    for p in PROMPTS:
        r = c.generate(
            prompt_token_ids=p, max_tokens=12, temperature=0, ignore_eos=True, logprobs=0
        )
        out.append((tuple(r.completions[0].token_ids), tuple(r.completions[0].logprobs)))
    return out


def assert_same(got, want, noise: float = 1e-6):
    for (tokens, lps), (want_tokens, want_lps) in zip(got, want):
        assert tokens == want_tokens
        assert np.max(np.abs(np.subtract(lps, want_lps))) <= noise
