"""Training-inference mismatch: the service's logprobs of sampled tokens
against the trainer's own recomputation of the same tokens at the same
positions, on the weights it pushed.

Both sides score one token with one set of weights; they differ only by
arithmetic (kernels, reduction order, the served dtype) and, when the
server is configured so, by what "logprob" means (vLLM's `--logprobs-mode`:
`raw_logprobs` is the model's own distribution, `processed_logprobs` the one
after temperature and top-k/top-p; the trainer must compute the matching one).
Pure Python: a trainer passes plain lists (`tensor.tolist()`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Mismatch:
    """Over `tokens` sampled tokens, with d = trainer - service logprob:
    `mean_abs` and `max_abs` of |d|, and `kl`, the mean of k3 = e^d - d - 1:
    an unbiased, never-negative estimate of KL(service || trainer) from the
    service's own samples (Schulman's k3)."""

    tokens: int
    mean_abs: float
    max_abs: float
    kl: float

    def __str__(self) -> str:
        return (
            f"mismatch over {self.tokens} tokens: mean |dlogp| {self.mean_abs:.2e}, "
            f"max {self.max_abs:.2e}, KL {self.kl:.2e}"
        )


def mismatch(service: Iterable[float], trainer: Iterable[float]) -> Mismatch:
    """The mismatch of two aligned sequences of logprobs (one per sampled
    token). ValueError when their lengths differ or a value is not finite."""
    s, t = list(service), list(trainer)
    if len(s) != len(t):
        raise ValueError(f"{len(s)} service logprobs against {len(t)} trainer logprobs")
    if not all(math.isfinite(x) for x in (*s, *t)):
        raise ValueError("a logprob is not finite (a token the sampler could not have drawn?)")
    if not s:
        return Mismatch(0, 0.0, 0.0, 0.0)
    d = [b - a for a, b in zip(s, t)]
    return Mismatch(
        tokens=len(d),
        mean_abs=sum(abs(x) for x in d) / len(d),
        max_abs=max(abs(x) for x in d),
        kl=sum(math.expm1(x) - x for x in d) / len(d),
    )
