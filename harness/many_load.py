"""Issue 24's GenerateMany load, shared by its test and its benchmark: many
long generations with top logprobs on one stream, and the server's peak RSS
sampled while they run."""

from __future__ import annotations

import threading

import psutil

from rollout_client import pb
from rollout_client.calls import core


def waiting_load(count: int, tokens: int, logprobs: int) -> list[pb.GenerateStreamRequest]:
    """`count` generations of `tokens` tokens (eos ignored), ids only."""
    return [
        core.build_generate_stream_request(
            request_id=f"w{i}",
            prompt_token_ids=[5 + i % 50, 6, 7],
            max_tokens=tokens,
            ignore_eos=True,
            logprobs=logprobs,
            omit_text=True,
        )
        for i in range(count)
    ]


class PeakRss:
    """A process's RSS at the start and its peak meanwhile, sampled every
    0.1 s by a thread while the `with` block runs; `grown_mib` after it."""

    def __init__(self, pid: int) -> None:
        self._proc = psutil.Process(pid)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample)
        self.start = self.peak = 0

    def _sample(self) -> None:
        while not self._done.wait(0.1):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self.start = self.peak = self._proc.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    @property
    def grown_mib(self) -> float:
        return (self.peak - self.start) / (1 << 20)
