"""Sessions on a Fleet: every call of a session goes to the replica that
holds it, and the session moves when that replica is gone.

- A new session goes to the replica on the fleet's version with the fewest
  sessions, then the fewest calls outstanding (Fleet.place_session).
- Every turn requires the fleet's version (SessionGenerateRequest.required_weight_version),
  as Fleet.generate does: a replica that restarted on its initial weights
  or missed an update refuses before any token.
- The fleet keeps a copy of the trajectory: after each call it reads what is
  new (GetSession with from_segment; the bytes read grow with the turn, not
  the history) and remembers the chat messages each segment came from.
- When the holding replica is gone (UNAVAILABLE), restarted (SESSION_LOST)
  or lags (WRONG_WEIGHT_VERSION on a turn), the session is re-opened on
  another replica from that copy (OpenSessionRequest.resume: the same ids,
  re-prefilled there) and the call is made again. A call and the read after
  it are one step: when either fails this way the step is made again on the
  new replica, so the copy never misses a call whose answer the caller got.
  A turn whose replica died mid-turn is sampled again: its first attempt's
  tokens are gone with the replica.
- The version rule holds across the move: a pinned session keeps its pin
  (the history carries it); once the fleet has moved past it, the turn is
  refused WRONG_WEIGHT_VERSION wherever the session is, and it is not moved.
- `move=False` (Fleet.open_session): a lost session fails with the status
  that said so (UNAVAILABLE or NOT_FOUND, SESSION_LOST) instead.
- Its OpenAI base URL (`base_url`, with the replicas' --http-port) names
  the replica that holds it: an agent's calls there go straight to that
  replica, unseen by the fleet. `sync()` reads them into the copy; when the
  replica is lost, `sync()` moves the session as a gRPC call would, and
  `base_url` then names the new replica (whose URL adopts the agent's
  conversation on its first call: docs/openai.md, "Across a fleet").

Not yet: streamed turns and LoRA adapters through the fleet (an adapter is
not loaded on the other replicas for a moved session).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

import grpc

from rollout.v1 import rollout_pb2 as pb
from rollout_client.calls import core
from rollout_client.client import RolloutClient, RolloutError
from rollout_client.fleet.replicas import Replica
from rollout_client.sessions import build_append_request, build_turn_request, merge_tail

log = logging.getLogger("rollout_client.fleet")

T = TypeVar("T")


class Placement(Protocol):
    """What a session needs of its Fleet."""

    wait_seconds: float

    @property
    def version(self) -> str | None:
        """The fleet's version."""

    def place_session(self, deadline: float) -> tuple[Replica, str]:
        """A replica on the fleet's version for a session (counted there)."""

    def session_left(self, r: Replica) -> None: ...

    def serves(self, r: Replica) -> bool:
        """`r` is alive and on the fleet's version."""

    def failed(self, r: Replica, e: RolloutError, version: str) -> None:
        """`r` answered a call with a status that says it cannot hold the session."""


def _lost(e: RolloutError) -> bool:
    """The replica cannot go on with the session (gone, restarted, lagging)."""
    return e.code == grpc.StatusCode.UNAVAILABLE or e.reason in (
        "SESSION_LOST",
        "WRONG_WEIGHT_VERSION",
    )


class FleetSession:
    """A session on a Fleet (Fleet.open_session); a context manager that
    closes it. `history` is the fleet's copy of the trajectory; `moves`
    lists each move as (from, to, why)."""

    def __init__(
        self, fleet: Placement, request: pb.OpenSessionRequest, move: bool, timeout: float | None
    ) -> None:
        self.fleet = fleet
        self.move = move
        self.timeout = timeout
        self.request = request  # the options a re-open keeps (budget, tools, render)
        self.moves: list[tuple[str, str, str]] = []
        self.history = pb.GetSessionResponse()
        # The messages each segment came from, aligned with history.segments.
        self.messages: list[Sequence[pb.ChatMessage]] = []
        deadline = time.monotonic() + fleet.wait_seconds
        while True:
            self.replica, _ = fleet.place_session(deadline)
            try:
                opened = self._client._unary(self._client.stub.OpenSession, request, timeout)
                break
            except RolloutError as e:
                fleet.session_left(self.replica)
                if not (move and _lost(e)):
                    raise
                fleet.failed(self.replica, e, "")
        self.opened = opened
        self.id = opened.session_id
        self._sync(0, list(request.messages))
        self.request.max_total_tokens = opened.max_total_tokens
        self._closed = False

    @property
    def _client(self) -> RolloutClient:
        return self.replica.client

    @property
    def base_url(self) -> str:
        """The session's OpenAI base URL on the replica that holds it now
        (empty when that replica serves no --http-port); read it again after
        `sync()` or any call moved the session."""
        return self.opened.base_url

    def sync(self) -> pb.GetSessionResponse:
        """Reads what calls on `base_url` added into the fleet's copy and
        returns it; when the replica is lost, re-opens the session elsewhere
        from the copy first (with `move`), so `base_url` names a live one."""
        self._step(lambda client, version: None, [])
        return self.trajectory()

    def __enter__(self) -> FleetSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(self, *, request_id: str = "", **params: Any) -> pb.SessionGenerateResponse:
        """The next model turn on the session's replica, on the fleet's version."""

        def turn(client: RolloutClient, version: str) -> pb.SessionGenerateResponse:
            request = build_turn_request(self.id, request_id, params, version)
            return client._unary(client.stub.SessionGenerate, request, self.timeout)

        return self._step(turn, [])

    def append(
        self, token_ids: Sequence[int] | None = None, messages: Sequence[Any] | None = None
    ) -> pb.AppendToSessionResponse:
        request_messages = core.chat_messages(messages or [])

        def append(client: RolloutClient, _: str) -> pb.AppendToSessionResponse:
            request = build_append_request(self.id, token_ids, messages)
            return client._unary(client.stub.AppendToSession, request, self.timeout)

        return self._step(append, request_messages)

    def trajectory(self) -> pb.GetSessionResponse:
        """The fleet's copy, up to date after every call made through the
        fleet (no call made; `sync()` reads calls made on `base_url`)."""
        out = pb.GetSessionResponse()
        out.CopyFrom(self.history)
        return out

    def close(self) -> pb.CloseSessionResponse:
        if self._closed:
            return pb.CloseSessionResponse()
        self._closed = True
        self.fleet.session_left(self.replica)
        request = pb.CloseSessionRequest(session_id=self.id)
        try:
            return self._client._unary(self._client.stub.CloseSession, request, self.timeout)
        except RolloutError as e:
            if _lost(e) or e.code == grpc.StatusCode.NOT_FOUND:
                return pb.CloseSessionResponse()  # nothing left to close there
            raise

    def _step(self, call: Callable[[RolloutClient, str], T], messages: Sequence[Any]) -> T:
        """`call` and the read of what it changed, on the session's replica;
        moved and made again when that replica cannot go on with it."""
        while True:
            if self._closed:
                raise RolloutError(grpc.StatusCode.FAILED_PRECONDITION, "the session is closed")
            version = self.fleet.version or ""
            pinned = self.history.pinned_weight_version
            # The fleet has moved past the session's pin: the server refuses
            # the turn (the pin and the required version differ) and no
            # replica could take it.
            stuck = bool(pinned) and pinned != version
            if self.move and not stuck and not self.fleet.serves(self.replica):
                self._move(f"{self.replica.target} does not serve {version!r}")
            before = len(self.history.segments)
            try:
                answer = call(self._client, version)
                self._sync(max(0, before - 1), messages, before)
                return answer
            except RolloutError as e:
                if stuck or not _lost(e):
                    raise
                self.fleet.failed(self.replica, e, version)
                if not self.move:
                    raise
                self._move(f"{self.replica.target}: {e.code.name} {e.reason or ''}".strip())

    def _sync(self, k: int, messages: Sequence[Any], before: int = 0) -> None:
        """Reads the session from segment `k` on into the copy; the segments
        new since `before` came from `messages` when they were an append
        (a server that says which messages each segment came from, those
        its base URL added included, is taken at its word instead)."""
        request = pb.GetSessionRequest(session_id=self.id, from_segment=k, include_messages=True)
        tail = self._client._unary(self._client.stub.GetSession, request, self.timeout)
        merge_tail(self.history, tail, k)
        del self.history.messages[:]  # kept aligned in self.messages instead
        n = len(self.history.segments)
        if tail.segments and len(tail.messages) == len(tail.segments):
            del self.messages[k:]
            self.messages.extend(list(m.messages) for m in tail.messages)
            return
        del self.messages[before:]
        self.messages.extend([] for _ in range(before, n))
        if messages and n > before:
            self.messages[n - 1] = list(messages)

    def _move(self, why: str) -> None:
        """Re-opens the session from the copy on another replica."""
        old = self.replica
        self.fleet.session_left(old)
        try:  # a lagging replica still holds it: free that (best effort)
            old.client._unary(
                old.client.stub.CloseSession, pb.CloseSessionRequest(session_id=self.id), 5.0
            )
        except RolloutError:
            pass
        history = pb.SessionHistory(trajectory=self.history)
        if any(self.messages):
            for m in self.messages:
                history.messages.add(messages=m)
        request = pb.OpenSessionRequest(
            resume=history,
            tools_json=self.request.tools_json,
            max_total_tokens=self.request.max_total_tokens,
            lora_adapter=self.request.lora_adapter,
            append_render=self.request.append_render,
            history_rule=self.request.history_rule,
        )
        deadline = time.monotonic() + self.fleet.wait_seconds
        while True:
            self.replica, _ = self.fleet.place_session(deadline)
            try:
                opened = self._client._unary(self._client.stub.OpenSession, request, self.timeout)
                break
            except RolloutError as e:
                self.fleet.session_left(self.replica)
                if not _lost(e):
                    raise
                self.fleet.failed(self.replica, e, "")
        log.info("session %s moved: %s -> %s (%s)", self.id, old.target, self.replica.target, why)
        self.moves.append((old.target, self.replica.target, why))
        self.opened = opened
        self.id = opened.session_id
        self.history.session_id = self.id


class Threads:
    """The threads an AsyncFleet runs the Fleet's blocking calls on: a pool
    of its own, sized for the calls a trainer has in flight (asyncio's
    default pool has min(32, CPUs + 4) threads: on 2 cores, 6 calls of an
    async trainer at once, the rest queued behind them)."""

    def __init__(self, max_threads: int) -> None:
        self.pool = ThreadPoolExecutor(max_threads, thread_name_prefix="async-fleet")

    async def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        self.pool.shutdown(wait=False)


class AsyncFleetSession:
    """A FleetSession for asyncio (AsyncFleet.open_session): each call run
    on the AsyncFleet's threads, as it runs the Fleet's."""

    def __init__(self, session: FleetSession, threads: Threads) -> None:
        self.session = session
        self.threads = threads

    async def __aenter__(self) -> AsyncFleetSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def generate(self, **kwargs: Any) -> pb.SessionGenerateResponse:
        return await self.threads.run(self.session.generate, **kwargs)

    async def append(self, *args: Any, **kwargs: Any) -> pb.AppendToSessionResponse:
        return await self.threads.run(self.session.append, *args, **kwargs)

    def trajectory(self) -> pb.GetSessionResponse:
        return self.session.trajectory()

    @property
    def base_url(self) -> str:
        return self.session.base_url

    async def sync(self) -> pb.GetSessionResponse:
        return await self.threads.run(self.session.sync)

    async def close(self) -> pb.CloseSessionResponse:
        return await self.threads.run(self.session.close)
