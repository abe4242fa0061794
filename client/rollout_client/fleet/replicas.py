"""The replicas of a Fleet and what the fleet knows of each.

One object, `Replicas`, holds every replica's state (alive, version, calls
outstanding, sessions) and the fleet's version, under one condition
variable. Routing (the package's __init__.py), probing and healing
(health.py), staged updates (staging.py) and sessions (sessions.py) all
depend on it, and it depends on none of them: the fleet's modules import in
one direction only.

Failures are told apart by their gRPC status code (`Failure.code`,
`RolloutError.code`) and ErrorInfo reason, never by the text of a message.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import grpc

from rollout_client.client import RolloutClient, RolloutError

log = logging.getLogger("rollout_client.fleet")


class Failure(str):
    """Why a replica failed a step, as text, with the status code that said
    so (None when no RPC did: a barrier that found bytes missing)."""

    code: grpc.StatusCode | None

    def __new__(cls, text: str, code: grpc.StatusCode | None = None) -> Failure:
        failure = super().__new__(cls, text)
        failure.code = code
        return failure

    @classmethod
    def of(cls, e: grpc.RpcError) -> Failure:
        return cls(f"{e.code().name}: {e.details()}", e.code())


def gone(why: object) -> bool:
    """Whether `why` (a Failure, a RolloutError) says the replica stopped answering."""
    code: grpc.StatusCode | None = getattr(why, "code", None)
    return code is grpc.StatusCode.UNAVAILABLE


@dataclass
class Replica:
    target: str
    client: RolloutClient
    version: str | None = None
    outstanding: int = 0
    served: int = 0
    alive: bool = True
    error: str = ""  # why it does not serve, "" when it does
    picked: int = 0  # when it was last picked (a count): ties go to the least recent
    sessions: int = 0  # open sessions this fleet placed on it
    heal_failures: int = 0  # in a row; the next heal waits 2**n probe rounds, up to 5 min
    heal_after: float = 0.0  # time.monotonic()


class Replicas:
    """Every replica and the fleet's version. `nudge()` asks for a probe
    round now (a replica refused the fleet's version); `waits`: whether a
    call may wait for a replica to come back (a keeper probes them)."""

    def __init__(self, replicas: list[Replica], nudge: Callable[[], None], waits: bool) -> None:
        self.all = replicas
        self.version: str | None = None
        self.changed = threading.Condition(threading.Lock())
        self._nudge = nudge
        self._waits = waits
        self._picks = 0

    def __iter__(self) -> Iterator[Replica]:
        return iter(self.all)

    def __len__(self) -> int:
        return len(self.all)

    def __getitem__(self, i: int) -> Replica:
        return self.all[i]

    def live(self) -> list[Replica]:
        return [r for r in self.all if r.alive]

    def state(self, r: Replica) -> str:
        if not r.alive:
            return f"dropped: {r.error}"
        if r.version != self.version:
            return f"lagging: {r.error or f'serves {r.version!r}'}"
        return f"serving {r.version}"

    def status(self) -> dict[str, str]:
        with self.changed:
            return {r.target: self.state(r) for r in self.all}

    def set_version(self, version: str) -> None:
        with self.changed:
            self.version = version
            self.changed.notify_all()

    def observe(self, r: Replica, version: str, why: str = "") -> None:
        """`r` answers and serves `version`; `why` it cannot serve, if it lags."""
        with self.changed:
            known = r.error if r.alive and r.version == version else ""  # a probe keeps it
            r.alive, r.version = True, version
            lags = version != self.version
            self._note(r, (why or known or f"serves {version!r}") if lags else "")
            self.changed.notify_all()

    def drop(self, r: Replica, why: Exception | str) -> None:
        with self.changed:
            r.alive = False
            self._note(r, str(why))

    def _note(self, r: Replica, error: str) -> None:
        """Sets why `r` does not serve ("" when it does), logging each change
        once rather than at every probe."""
        if error == r.error:
            return
        r.error = error
        if error:
            log.warning("replica %s: %s", r.target, self.state(r))
        else:
            log.info("replica %s: %s", r.target, self.state(r))

    def failed(self, r: Replica, e: RolloutError, version: str) -> bool:
        """What a call's failure on `r` says of it, by code and reason:
        gone (UNAVAILABLE), lagging (WRONG_WEIGHT_VERSION) or restarted
        (SESSION_LOST); False when it says nothing of the replica."""
        if gone(e):
            self.drop(r, e)
        elif e.reason == "WRONG_WEIGHT_VERSION":
            with self.changed:
                if version == self.version and r.version == version:
                    r.version = None  # lagging until probed again
                    self._note(r, f"refused {version!r} (WRONG_WEIGHT_VERSION)")
            self._nudge()
        elif e.reason == "SESSION_LOST":  # restarted: on its initial weights until probed
            with self.changed:
                r.version = None
                self._note(r, "restarted (SESSION_LOST)")
            self._nudge()
        else:
            return False
        return True

    def ready(self, deadline: float) -> list[Replica]:
        """The replicas on the fleet's version, waited for until `deadline`
        (with self.changed held)."""
        # No call goes out without a version to require (none before the
        # first refresh, when replicas and fleet alike have None).
        while self.version is None or not (
            ready := [r for r in self.live() if r.version == self.version]
        ):
            left = deadline - time.monotonic()
            if left <= 0 or not self._waits:
                states = "; ".join(f"{r.target}: {self.state(r)}" for r in self.all)
                raise RolloutError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"no replica serves the fleet's version {self.version!r} ({states})",
                )
            self.changed.wait(left)
        return ready

    def pick(
        self, prompt_ids: Sequence[int] | None, deadline: float, affinity_tokens: int
    ) -> tuple[Replica, str]:
        """A replica for one call (counted outstanding) and the version it must serve."""
        with self.changed:
            ready = self.ready(deadline)
            assert self.version is not None
            if affinity_tokens and prompt_ids:
                key = ",".join(map(str, prompt_ids[:affinity_tokens])).encode()
                r = sorted(ready, key=lambda x: x.target)[zlib.crc32(key) % len(ready)]
            else:
                r = min(ready, key=lambda x: (x.outstanding, x.picked))
            self._picked(r)
            r.outstanding += 1
            return r, self.version

    def _picked(self, r: Replica) -> None:
        """Marks `r` the most recently picked (ties go to the least recent)."""
        self._picks += 1
        r.picked = self._picks

    def returned(self, r: Replica) -> None:
        with self.changed:
            r.outstanding -= 1

    def place_session(self, deadline: float) -> tuple[Replica, str]:
        """The replica on the fleet's version with the fewest sessions."""
        with self.changed:
            ready = self.ready(deadline)
            assert self.version is not None
            r = min(ready, key=lambda x: (x.sessions, x.outstanding, x.picked))
            self._picked(r)
            r.sessions += 1
            return r, self.version

    def session_left(self, r: Replica) -> None:
        with self.changed:
            r.sessions = max(0, r.sessions - 1)

    def serves(self, r: Replica) -> bool:
        with self.changed:
            return r.alive and r.version == self.version
