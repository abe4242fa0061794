"""Callers that keep calling Generate while a server stops, for the tests
that a stopping server answers every call it does not serve UNAVAILABLE,
never CANCELLED (tests/engine/serving/test_faults.py, test_shutdown.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc

from harness.serverproc import ServerProcess
from rollout_client import RolloutClient, RolloutError


def _call_until_exit(
    server: ServerProcess, codes: list, deadline: float, every: float, max_tokens: int
) -> None:
    with RolloutClient(server.target, retries=0, timeout=20) as c:
        while server.proc.poll() is None and time.monotonic() < deadline:
            try:
                c.generate(prompt_token_ids=[1, 2, 3], max_tokens=max_tokens)
            except RolloutError as e:  # they succeed until the server stops
                codes.append(e.code)
            if every:
                time.sleep(every)


@contextmanager
def calling_until_exit(
    server: ServerProcess, callers: int, every: float = 0.0, max_tokens: int = 1, within: float = 60
) -> Iterator[list[grpc.StatusCode]]:
    """`callers` threads call Generate (every `every` s, back to back by
    default) from 0.5 s before the block's body until `server` has exited
    (at most `within` s); yields the status of each call that failed,
    complete once the block has ended (it joins them)."""
    codes: list[grpc.StatusCode] = []
    deadline = time.monotonic() + within
    threads = [
        threading.Thread(target=_call_until_exit, args=(server, codes, deadline, every, max_tokens))
        for _ in range(callers)
    ]
    for t in threads:
        t.start()
    time.sleep(0.5)  # the callers are calling
    try:
        yield codes
    finally:
        for t in threads:
            t.join(within)
