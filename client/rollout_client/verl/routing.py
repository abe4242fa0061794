"""Which of a replica's services a call goes to: the one that already holds
the call's prefix, else the least loaded. Pure: no gRPC, no Ray.

verl's GlobalRequestLoadBalancer keeps a trajectory on one replica (it maps
verl's request id to a server, LRU, least in flight for new ids), but its
client then sends each turn under a fresh request id (LLMServerClient.
_vllm_request_id), so the replica never sees the trajectory's id. What it
does see: a later turn's prompt extends an earlier turn's prompt and output
(the tool's answer appended), and a resumed call's prompt extends the
aborted call's. So the map here is keyed by token history, LRU as verl's:
the longest history sent before that prefixes the prompt names the service
holding its KV cache; a prompt no history prefixes goes to the service with
the fewest calls in flight. A service lost mid-trajectory (`lost`) is left
out for `down_seconds`; its trajectories move to the least loaded one and
recompute their prefix there.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

# A rolling hash of every prefix in one pass (a dict lookup per token, about
# 2 ms for 8k tokens in CPython); keyed with the length, a false match needs
# two equal-length histories to collide mod a 61-bit prime.
_MOD = (1 << 61) - 1
_BASE = 1_000_003
DEFAULT_CAPACITY = 10_000  # verl's DEFAULT_ROUTING_CACHE_SIZE


def _prefix_hashes(ids: Sequence[int]) -> list[int]:
    out, h = [], 0
    for t in ids:
        h = (h * _BASE + int(t) + 1) % _MOD
        out.append(h)
    return out


class Router:
    """Routes over `n` services. `offset` (the replica's rank) rotates the
    tie order so that replicas starting at once do not all pick service 0."""

    def __init__(
        self,
        n: int,
        *,
        offset: int = 0,
        capacity: int = DEFAULT_CAPACITY,
        down_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.n = n
        self.inflight = [0] * n
        self.calls = [0] * n  # routed here since start, for diagnostics
        self._offset = offset
        self._histories: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._capacity = capacity
        self._down_until = [0.0] * n
        self._down_seconds = down_seconds
        self._clock = clock

    def up(self, i: int) -> bool:
        return self._clock() >= self._down_until[i]

    def holder(self, prompt: Sequence[int]) -> int | None:
        """The service that the longest recorded history prefixing `prompt`
        went to (None: no such history)."""
        best = None
        for length, h in enumerate(_prefix_hashes(prompt), start=1):
            i = self._histories.get((length, h))
            if i is not None:
                best = (length, h, i)
        if best is None:
            return None
        self._histories.move_to_end(best[:2])
        return best[2]

    def pick(self, prompt: Sequence[int], avoid: Sequence[int] = ()) -> int:
        """The holder of `prompt`'s history if it is up and not in `avoid`;
        else the least loaded of the services that are (of all, if none is)."""
        i = self.holder(prompt)
        if i is not None and self.up(i) and i not in avoid:
            return i
        order = [(self._offset + k) % self.n for k in range(self.n)]
        candidates = [j for j in order if self.up(j) and j not in avoid] or order
        return min(candidates, key=lambda j: self.inflight[j])

    def start(self, i: int) -> None:
        self.inflight[i] += 1
        self.calls[i] += 1

    def finish(self, i: int, prompt: Sequence[int] = (), output: Sequence[int] = ()) -> None:
        """A call on service `i` ended: its prompt, and the prompt with its
        output, are now in that service's prefix cache (the prompt alone in
        case the next turn renders the output differently)."""
        self.inflight[i] -= 1
        hashes = _prefix_hashes([*prompt, *output])
        for length in {len(prompt), len(hashes)} - {0}:
            key = (length, hashes[length - 1])
            self._histories[key] = i
            self._histories.move_to_end(key)
        while len(self._histories) > self._capacity:
            self._histories.popitem(last=False)

    def lost(self, i: int) -> None:
        """Service `i` did not answer: route around it for a while."""
        self._down_until[i] = self._clock() + self._down_seconds

    def forget(self) -> None:
        """Drop every history (verl's clear_sticky_cache)."""
        self._histories.clear()
