"""The open sessions: who owns each, what they may hold, when they expire.

Every bound is checked here, before any work: sessions in all and per caller
(the caller is auth.Caller.owner, a digest of the bearer token; "" with auth
off), and tokens. A session reserves its whole budget when it opens, so the
sum of budgets never passes --max-session-tokens and a trajectory never runs
out of room half-way for another caller's sake.

The store holds sessions by the ids session_ids.py issues, and is asked
only for ids that `SessionIds.check` found to be of this server's run (the
RPCs check first): one that is not open is SESSION_NOT_FOUND, with why
(closed, expired) while the id is remembered. One call works on a session
at a time (`using`): a second gets ABORTED (SESSION_BUSY) instead of
waiting, so two turns can never interleave their tokens.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rollout.v1 import rollout_pb2 as pb
from rollout_service.ops.auth import Caller
from rollout_service.sessions.trajectory import SEGMENT_BYTES, TOKEN_BYTES, Segment, Trajectory
from rollout_service.status.errors import (
    Aborted,
    FailedPrecondition,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)

# Appended messages' text a session may hold, per token of its budget.
TEXT_BYTES_PER_TOKEN = 16
MAX_SEGMENTS = 512
# Closed and expired ids remembered, to say why one is not open.
_REMEMBERED = 4096


@dataclass(frozen=True)
class SessionLimits:
    max_sessions: int
    max_sessions_per_caller: int
    max_session_tokens: int
    idle_timeout_seconds: float
    max_model_len: int

    def to_proto(self) -> pb.SessionLimits:
        return pb.SessionLimits(
            max_sessions=self.max_sessions,
            max_sessions_per_caller=self.max_sessions_per_caller,
            max_session_tokens=self.max_session_tokens,
            bytes_per_held_token=TOKEN_BYTES + TEXT_BYTES_PER_TOKEN,
            idle_timeout_seconds=self.idle_timeout_seconds,
            max_total_tokens=self.max_model_len,
            max_segments=MAX_SEGMENTS,
            bytes_per_segment=SEGMENT_BYTES,
        )


@dataclass(eq=False)
class Session:
    """One open trajectory and how it renders and generates."""

    id: str
    owner: str
    budget: int
    lora_adapter: str = ""
    pinned_version: str = ""
    # Renders chat: opened with messages, or messages were appended.
    chat: bool = False
    # Opened with APPEND_RENDER_WHOLE (else isolated).
    renders_whole: bool = True
    # What its base URL does with a history that does not extend the held
    # one (pb.HistoryRule), and the OpenAI messages it has seen there
    # (http/session_history.py; None: it has none a chat could extend).
    history_rule: int = pb.HISTORY_RULE_REFUSE
    chat_history: Any = None
    # A resumed history's opening messages, until its base URL's first chat
    # adopts the conversation the old URL saw (session_history.adopt).
    resumed_prompt: list[Any] | None = None
    # APPEND_RENDER_WHOLE's conversation: message dicts, and each model turn
    # as its Segment (its content decoded when rendered); None: isolated.
    conversation: list[Any] | None = None
    tools: list[dict[str, Any]] | None = None
    # The text of every message its segments hold (Segment.messages), bounded
    # by TEXT_BYTES_PER_TOKEN per token of its budget.
    text_bytes: int = 0
    # Tokens it was re-opened with (OpenSessionRequest.resume).
    resumed_tokens: int = 0
    trajectory: Trajectory = field(default_factory=Trajectory)
    busy: bool = False
    # Aborts the running turn (CloseSession), while one runs.
    abort_turn: Callable[[], Awaitable[None]] | None = None
    last_used: float = 0.0

    @property
    def remaining(self) -> int:
        return self.budget - len(self.trajectory)

    def check_room(self, n: int, what: str, segments: int = 1) -> None:
        """SESSION_BUDGET unless `n` more tokens (in `segments` more segments) fit."""
        if n > self.remaining:
            raise FailedPrecondition(
                f"{what}: {n} tokens do not fit: the session holds {len(self.trajectory)} of "
                f"its budget of {self.budget} (max_total_tokens), {self.remaining} left",
                reason=pb.ERROR_REASON_SESSION_BUDGET,
            )
        if len(self.trajectory.segments) + segments > MAX_SEGMENTS:
            raise FailedPrecondition(
                f"{what}: the session holds {MAX_SEGMENTS} segments, the most one may",
                reason=pb.ERROR_REASON_SESSION_BUDGET,
            )

    # How each kind of segment moves the render state: written once, for the
    # calls that add segments and for a resumed history replaying them.

    def opened_with(self, conversation: list[Any] | None, whole: bool, text_bytes: int) -> None:
        """The prompt: chat messages (`conversation`) or ids and text (None)."""
        self.chat = conversation is not None
        self.renders_whole = whole
        self.text_bytes = text_bytes
        if conversation is not None and whole:
            self.conversation = list(conversation)

    def appended_ids(self) -> None:
        # Ids the conversation cannot describe: later messages render isolated,
        # and the next turn gets no generation prompt (the caller sent its own).
        self.conversation = None
        self.chat = False

    def appended_messages(self, new: list[Any], text_bytes: int) -> None:
        if self.conversation is not None:
            self.conversation.extend(new)
        self.text_bytes += text_bytes
        self.chat = True

    def restarted_with(self, conversation: list[Any], text_bytes: int) -> None:
        """A new context rendered whole from `conversation` (HISTORY_RULE_RESTART):
        later messages render after it, not after what came before."""
        self.chat = True
        self.text_bytes += text_bytes  # the earlier segments keep their messages
        if self.renders_whole:
            self.conversation = list(conversation)

    def add_turn_to_conversation(self, seg: Segment) -> None:
        if self.conversation is not None and (
            not self.conversation or self.conversation[-1] is not seg
        ):
            self.conversation.append(seg)


class SessionStore:
    """The open sessions of this server's run."""

    def __init__(self, limits: SessionLimits, clock: Callable[[], float] = time.monotonic):
        self.limits = limits
        self._clock = clock
        self._open: dict[str, Session] = {}
        self._per_owner: Counter[str] = Counter()
        self.reserved = 0
        self._ended: OrderedDict[str, str] = OrderedDict()
        self._swept = 0.0

    def __len__(self) -> int:
        self.sweep()
        return len(self._open)

    def held(self) -> tuple[int, int]:
        """Sessions open and the bytes their histories hold, for the metrics
        (ops/metrics.py), whose thread reads it while the loop runs: no sweep,
        and the sessions copied in one call (the dict cannot change under it)."""
        sessions = list(self._open.values())
        held = sum(
            len(s.trajectory) * TOKEN_BYTES
            + len(s.trajectory.segments) * SEGMENT_BYTES
            + s.text_bytes
            for s in sessions
        )
        return len(sessions), held

    def new(self, session_id: str, owner: str, budget: int, **options: Any) -> Session:
        """A new session (`session_id` from SessionIds.issue), counted against
        every limit (RESOURCE_EXHAUSTED, naming the flag, past one); `add`
        makes it open, `release` gives its room back if it never opens."""
        self.sweep()
        lim = self.limits
        if len(self._open) >= lim.max_sessions:
            raise ResourceExhausted(
                f"{len(self._open)} sessions are open, the limit (--max-sessions) is "
                f"{lim.max_sessions}; close finished ones"
            )
        if self._per_owner[owner] >= lim.max_sessions_per_caller:
            raise ResourceExhausted(
                f"this caller has {self._per_owner[owner]} sessions open, the limit "
                f"(--max-sessions-per-caller) is {lim.max_sessions_per_caller}; close finished ones"
            )
        if self.reserved + budget > lim.max_session_tokens:
            raise ResourceExhausted(
                f"max_total_tokens: open sessions reserve {self.reserved} tokens; {budget} more "
                f"would pass the limit (--max-session-tokens) of {lim.max_session_tokens}"
            )
        session = Session(
            id=session_id,
            owner=owner,
            budget=budget,
            last_used=self._clock(),
            **options,
        )
        self._per_owner[owner] += 1
        self.reserved += budget
        return session

    def add(self, session: Session) -> None:
        self._open[session.id] = session

    def release(self, session: Session, why: str = "") -> None:
        """Frees what `session` reserved; `why` it ended, remembered."""
        self._open.pop(session.id, None)
        self._per_owner[session.owner] -= 1
        if self._per_owner[session.owner] <= 0:
            del self._per_owner[session.owner]
        self.reserved -= session.budget
        if why:
            self._ended[session.id] = why
            while len(self._ended) > _REMEMBERED:
                self._ended.popitem(last=False)

    def get(self, session_id: str, caller: Caller, field_name: str = "session_id") -> Session:
        """The open session `session_id` (an id of this run: SessionIds.check),
        if `caller` may use it."""
        self.sweep()
        session = self._open.get(session_id)
        if session is None:
            why = self._ended.get(session_id, "was never opened here, or has ended")
            raise NotFound(f"{field_name}: session {session_id} {why}")
        if not caller.admin and session.owner != caller.owner:
            raise PermissionDenied(f"{field_name}: session {session_id} belongs to another caller")
        session.last_used = self._clock()
        return session

    def close(self, session: Session) -> None:
        if session.id in self._open:
            self.release(session, "was closed")

    def sweep(self) -> None:
        """Expires sessions idle past the timeout (at most once a second;
        a session with a call running is not idle)."""
        now = self._clock()
        if now - self._swept < 1.0:
            return
        self._swept = now
        timeout = self.limits.idle_timeout_seconds
        for s in [s for s in self._open.values() if not s.busy and now - s.last_used > timeout]:
            self.release(s, f"expired after {timeout:g} s without a call")

    @contextmanager
    def using(self, session: Session) -> Iterator[Session]:
        """One call at a time on `session` (ABORTED, SESSION_BUSY, otherwise)."""
        if session.busy:
            raise Aborted(
                f"session_id: another call is working on session {session.id}; one at a time",
                reason=pb.ERROR_REASON_SESSION_BUSY,
            )
        session.busy = True
        try:
            yield session
        finally:
            session.busy = False
            session.last_used = self._clock()
