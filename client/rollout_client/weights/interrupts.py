"""What an interrupted weight update tells its caller: whether its commit had
been sent, and so whether it may have been applied. A server that received
the commit applies the update to the end even when the client goes away
(rollout.proto, UpdateWeights); before the commit it discards what it got.

The push and whoever interrupts it share one PushState. The push marks the
commit just before sending it and sends it only if it was not stopped; the
interrupter stops the push (its call is cancelled, nothing more goes out),
then reads the mark. In that order the answer cannot be wrong: a commit
marked after the read is never sent.

Ctrl-C reaches RolloutClient's push as KeyboardInterrupt in the caller's
thread; it becomes UpdateInterrupted, still a KeyboardInterrupt, so that
code that lets Ctrl-C end the program (and `except Exception` handlers that
must not swallow it) behaves as before. AsyncRolloutClient's push is
interrupted by cancellation (asyncio.run turns Ctrl-C into it): the
CancelledError stays what it is, its type included (on
Python 3.11 asyncio.timeout() turns only that exact type into
TimeoutError), and carries the same message as a note.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")


class Stopped(Exception):
    """The push ended because its PushState was stopped (raised in the
    pushing thread; whoever stopped it tells the caller what happened)."""


class PushState:
    """Shared by one update_weights call's push (every attempt, delta and
    full alike) and whoever may interrupt it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stopped = False
        self._cancel: Callable[[], object] | None = None
        # Set just before the commit (UpdateWeights' last message, or
        # CommitUpdate) is sent, by any attempt; never cleared.
        self.commit_sent = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def check(self) -> None:
        """Raises Stopped once the push is stopped."""
        if self._stopped:
            raise Stopped

    def on_stop(self, cancel: Callable[[], object]) -> None:
        """`cancel` (the current call's) runs when the push is stopped; at
        once if it is stopped already."""
        with self._lock:
            self._cancel = cancel
            stopped = self._stopped
        if stopped:
            cancel()

    def committing(self) -> bool:
        """Marks the commit as sent, just before it is; False if the push
        is stopped (then the commit must not go out)."""
        with self._lock:
            if self._stopped:
                return False
            self.commit_sent = True
            return True

    def stop(self) -> None:
        """Ends the push: its current call is cancelled and nothing it had
        not sent goes out. Read `commit_sent` after this, not before."""
        with self._lock:
            self._stopped = True
            cancel = self._cancel
        if cancel is not None:
            cancel()


def message(version: str, commit_sent: bool, cli: bool = False) -> str:
    """What an interrupted update of `version` did, and how to check."""
    if not commit_sent:
        return (
            f"the update to weight version {version!r} was interrupted before its commit "
            "was sent: not applied (the server discards what it received and serves the "
            "weights it served before)"
        )
    if cli:
        check = (
            "`rollout-client info` shows the served weight version, or run the same "
            "push-weights again (same file, same --version): if it was applied, the server "
            "answers at once with its acknowledgement (replayed)"
        )
    else:
        check = (
            "check server_info().weight_version, or push the same bytes under the same "
            "version again, which is answered replayed=True if it was"
        )
    return (
        f"the update to weight version {version!r} was interrupted after its commit was "
        "sent: it may have been applied (a server that received the commit applies the "
        f"update to the end): {check}"
    )


class UpdateInterrupted(KeyboardInterrupt):
    """Ctrl-C during RolloutClient.update_weights. `commit_sent`: False, the
    update was not applied; True, it may have been (the message says how to
    check). A KeyboardInterrupt still: Ctrl-C ends the program as before."""

    def __init__(self, version: str, commit_sent: bool) -> None:
        super().__init__(message(version, commit_sent))
        self.version = version
        self.commit_sent = commit_sent


@contextmanager
def reported(state: PushState, version: str) -> Iterator[None]:
    """Ctrl-C inside stops the push and raises UpdateInterrupted."""
    try:
        yield
    except UpdateInterrupted:
        raise
    except KeyboardInterrupt:
        state.stop()  # first: no commit goes out after commit_sent is read
        raise UpdateInterrupted(version, state.commit_sent) from None


@contextmanager
def noted(state: PushState, version: str) -> Iterator[None]:
    """Around an asyncio push: cancelled, the push is stopped and the
    CancelledError is raised again with the update's fate as a note."""
    try:
        yield
    except asyncio.CancelledError as e:
        state.stop()  # first: no commit goes out after commit_sent is read
        e.add_note(message(version, state.commit_sent))
        raise


async def in_thread(state: PushState, version: str, push: Callable[[], T]) -> T:
    """`push()` in a worker thread, noted when cancelled. The thread is not
    waited for: the note is right without it, and a thread stuck in a call
    would hold the cancellation up."""
    pushing = asyncio.ensure_future(asyncio.to_thread(push))
    try:
        with noted(state, version):
            return await asyncio.shield(pushing)
    except asyncio.CancelledError:
        pushing.add_done_callback(_outcome_seen)
        raise


def _outcome_seen(pushing: asyncio.Future[Any]) -> None:
    """The abandoned push's outcome (Stopped, mostly), fetched so that asyncio
    does not log it as an exception never retrieved."""
    if not pushing.cancelled():
        pushing.exception()
