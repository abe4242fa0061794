"""Several replicas of the service as one, from the trainer's side.

- Generate goes to a replica serving the fleet's current version: the one
  with the fewest calls outstanding, ties to the one picked least recently
  (sequential callers go round the replicas instead of all landing on the
  first), or, with `prefix_affinity_tokens`, always the same replica for the
  same prompt prefix (its prefix cache stays warm).
- Every call carries `required_weight_version` (the fleet's version), so a
  rollout cannot come from other weights even when the fleet's view is stale
  (a replica restarted on its initial weights since it was last seen): that
  replica refuses at admission (WRONG_WEIGHT_VERSION), before any token; the
  fleet marks it lagging, sends the call to another replica (or waits up to
  `wait_seconds` for one) and heals the lagging one in the background.
- One weight update for all, with a version barrier: the source is read
  once and its chunks go to every replica (staging.py); only when every
  replica holds every byte is it committed everywhere. If any replica fails
  before the commit, the update is aborted everywhere: no replica serves it.
  The commits are separate calls: a replica that dies between the barrier
  and its own commit leaves the others on the new version; the
  acknowledgement lists who has what.
- A keeper thread (health.py) probes every replica every
  `probe_seconds`: a replica that stops answering is dropped and reported,
  never waited on; a dropped one is probed again and rejoins when it
  answers; one on another version is first brought to the fleet's.

Replicas come from a list of targets or from one DNS name resolving to
several addresses (a Kubernetes headless Service).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import grpc

from rollout.v1 import rollout_pb2 as pb
from rollout_client.client import RolloutClient, RolloutError
from rollout_client.fleet import health, staging
from rollout_client.fleet.health import Keeper, Ledger
from rollout_client.fleet.replicas import Replica, Replicas
from rollout_client.fleet.sessions import AsyncFleetSession, FleetSession, Threads
from rollout_client.fleet.staging import FleetUpdateError  # noqa: F401  (re-exported)
from rollout_client.sessions import build_open_request
from rollout_client.weights import push

if TYPE_CHECKING:  # numpy: imported by delta pushes only
    from rollout_client.weights.delta_costs import Choice
    from rollout_client.weights.delta_push import DeltaUpdate, PushedWeights

# The transport of the fleet's pushes, for their costs (delta_costs.py):
# staged to every replica, then committed.
_FLEET = "fleet"

log = logging.getLogger("rollout_client.fleet")


def resolve(targets: str | list[str]) -> list[str]:
    """A list of targets as given, or every address a `name:port` resolves to."""
    if not isinstance(targets, str):
        return list(targets)
    name, _, port = targets.rpartition(":")
    infos = socket.getaddrinfo(name, int(port), type=socket.SOCK_STREAM)
    addresses = sorted({str(info[4][0]) for info in infos})  # IP text (ints: other families)
    return [f"[{a}]:{port}" if ":" in a else f"{a}:{port}" for a in addresses]


@dataclass
class FleetAck:
    """The outcome of a fleet update: each replica's acknowledgement, the
    replicas dropped on the way and those left out because they lag (a
    partial update would leave them mixed; the keeper heals them), target ->
    why."""

    version: str
    acks: dict[str, pb.UpdateWeightsResponse]
    dropped: dict[str, str] = field(default_factory=dict)
    lagging: dict[str, str] = field(default_factory=dict)


class Fleet:
    """Replicas of one model behind one client.

    `probe_seconds`: how often the keeper probes every replica (None: no
    keeper; call `check()` yourself). `wait_seconds`: how long generate
    waits for a replica on the fleet's version when none serves it.
    `initial_version`: what a freshly started replica reports (the servers'
    --initial-weight-version); a replica on it, or on a version this fleet
    pushed or replaced, is healed; one on any other version was updated by
    another client and is left out, not fought over (see fleet/health.py).
    `heal_from_source=False`: keep no reference to the last update's source
    (a lagging replica then waits for the next full update)."""

    def __init__(
        self,
        targets: str | list[str],
        *,
        prefix_affinity_tokens: int = 0,
        timeout: float = 600.0,
        probe_seconds: float | None = 5.0,
        wait_seconds: float = 60.0,
        initial_version: str = "initial",
        heal_from_source: bool = True,
        **options: Any,
    ) -> None:
        self.prefix_affinity_tokens = prefix_affinity_tokens
        self.timeout = timeout
        self.wait_seconds = wait_seconds
        self.heal_from_source = heal_from_source
        self.replicas = Replicas(
            [Replica(t, RolloutClient(t, timeout=timeout, **options)) for t in resolve(targets)],
            nudge=self._nudge,
            waits=probe_seconds is not None,
        )
        self.ledger = Ledger(initial_version)
        # What update_weights(delta=True) pushed last (see RolloutClient.pushed).
        self.pushed: PushedWeights | None = None
        self._updating = threading.RLock()  # one update or heal at a time
        self._keeper = Keeper(self.check, probe_seconds) if probe_seconds else None

    @property
    def version(self) -> str | None:
        """The fleet's version: what every call requires."""
        return self.replicas.version

    def _nudge(self) -> None:
        if self._keeper is not None:
            self._keeper.nudge()

    def close(self) -> None:
        if self._keeper is not None:
            self._keeper.stop()
        for r in self.replicas:
            r.client.close()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def refresh(self, timeout: float = 10.0) -> None:
        """Reads every live replica's version; the fleet's becomes the most
        common (ties: its own). How a fleet adopts another client's update."""
        with self._updating:
            seen: list[tuple[Replica, str]] = []
            for r in self.replicas.live():
                try:
                    info = r.client.server_info(timeout)
                    seen.append((r, "" if info.degraded else info.weight_version))
                except RolloutError as e:
                    self.replicas.drop(r, e)
            versions = collections.Counter(v for _, v in seen)
            if versions:
                version = max(versions, key=lambda v: (versions[v], v == self.version))
                self.replicas.set_version(version)
            for r, v in seen:
                self.replicas.observe(r, v)

    def check(self) -> None:
        """One round of the keeper's work in the caller's thread: every
        replica probed, every lagging one healed (see fleet/health.py)."""
        interval = self._keeper.interval if self._keeper is not None else 0.0
        for r in self.replicas:
            health.probe(self.replicas, r, self.timeout)
        for r in self.replicas:
            if r.alive and r.version != self.version:
                health.heal(self.replicas, r, self.ledger, self._updating, self.timeout, interval)

    def status(self) -> dict[str, str]:
        """Each replica's state: "serving <version>", "lagging: <why>" or
        "dropped: <why>"."""
        return self.replicas.status()

    def open_session(
        self, *, move: bool = True, timeout: float | None = None, **kwargs: Any
    ) -> FleetSession:
        """A session (build_open_request's arguments: rollout_client/sessions.py) on the replica
        with the fewest sessions; its calls follow it (see fleet/sessions.py),
        and its `base_url` is that replica's URL for it (an agent's OpenAI
        base URL). `move=False`: fail instead of re-opening it elsewhere
        when its replica is lost."""
        if self.version is None:
            self.refresh()
        request = build_open_request(**kwargs)
        return FleetSession(self, request, move, self.timeout if timeout is None else timeout)

    # fleet/sessions.py's Placement

    def place_session(self, deadline: float) -> tuple[Replica, str]:
        return self.replicas.place_session(deadline)

    def session_left(self, r: Replica) -> None:
        self.replicas.session_left(r)

    def serves(self, r: Replica) -> bool:
        return self.replicas.serves(r)

    def failed(self, r: Replica, e: RolloutError, version: str) -> None:
        self.replicas.failed(r, e, version)

    def generate(self, **kwargs: Any) -> pb.GenerateResponse:
        """RolloutClient.generate on one replica on the fleet's version (see
        the module docstring); the fleet sets `required_weight_version`."""
        if "required_weight_version" in kwargs:
            raise TypeError("Fleet.generate sets required_weight_version (the fleet's version)")
        if self.version is None:
            self.refresh()
        deadline = time.monotonic() + self.wait_seconds
        prompt = kwargs.get("prompt_token_ids")
        while True:
            r, version = self.replicas.pick(prompt, deadline, self.prefix_affinity_tokens)
            try:
                response = r.client.generate(required_weight_version=version, **kwargs)
                r.served += 1
                return response
            except RolloutError as e:
                # gone or lagging: the call goes to another replica
                if not self.replicas.failed(r, e, version):
                    raise
            finally:
                self.replicas.returned(r)

    def update_weights(
        self,
        source: Any,
        version: str,
        *,
        pause_mode: pb.PauseMode = pb.PAUSE_MODE_WAIT,
        chunk_bytes: int = push.DEFAULT_CHUNK_BYTES,
        checksum: bool = False,
        drain_timeout_seconds: float | None = None,
        timeout: float = 600.0,
        before_commit: Callable[[], None] | None = None,
        delta: bool | Literal["always"] = True,
    ) -> FleetAck:
        """One update for every live replica, committed only once all of them
        hold it (see the module docstring). A partial update (not every
        parameter) leaves out the replicas that lag. `before_commit()` runs
        between staging and the commit (tests use it to kill a replica).

        `delta` (on by default), as RolloutClient.update_weights(delta=...):
        one delta goes to every replica when each offers the version this
        fleet pushed last as its delta base and a delta is the cheaper way
        (measured over the fleet's staged pushes), else a full update goes
        to all. The fleet then keeps a copy of what it pushed (`self.pushed`:
        the model's size in host memory); `delta=False` pushes in full and
        keeps none."""
        with self._updating:
            if self.version is None:
                self.refresh()
            live = self.replicas.live()
            if not live:
                raise RolloutError(grpc.StatusCode.UNAVAILABLE, "no live replica in the fleet")
            source, unreplayable = health.replayable(source, self.heal_from_source)
            manifest = live[0].client.server_info(timeout).parameters
            u = push.prepare(
                source,
                version,
                manifest,
                pause_mode=pause_mode,
                chunk_bytes=chunk_bytes,
                checksum=checksum,
                drain_timeout_seconds=drain_timeout_seconds,
            )
            u.timeout = timeout
            full = {t.name for t in u.tensors} == {p.name for p in manifest}
            targets = [r for r in live if full or r.version == self.version]
            lagging = {r.target: self.replicas.state(r) for r in live if r not in targets}
            if not targets:
                raise RolloutError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"a partial update needs a replica on {self.version!r}; all lag: {lagging}",
                )
            infos = [r.client.server_info(timeout) for r in targets]
            u.batch_chunks = all(i.accepts_chunk_batches for i in infos)
            prints: list[int] | None = None if unreplayable else []
            d, choice = (
                self._delta(u, [i.delta_base_version for i in infos], delta == "always")
                if delta
                else (None, None)
            )
            started = time.perf_counter()
            # A delta is applied to the fleet's copy while it is staged
            # (delta_push.PushedWeights.sending), undone if no replica commits.
            pushed = self.pushed
            sending = contextlib.nullcontext() if pushed is None or d is None else pushed.sending(d)
            with sending:
                opened = staging.stage(
                    u if d is None else d.update,
                    targets,
                    timeout,
                    before_commit=before_commit,
                    on_unavailable=self.replicas.drop,
                    fingerprints=prints if d is None else None,
                )
                acks, dropped = staging.commit_all(targets, opened, timeout)
            if pushed is not None and d is not None and not acks:
                pushed.withdraw(d)
            if d is not None and prints is not None:
                prints.extend(t.spec.crc32c for t in d.tensors)  # each whole tensor's
            if choice is not None and acks:
                assert pushed is not None
                ack = next(iter(acks.values()))
                seconds = time.perf_counter() - started
                pushed.acknowledged(u, d, choice, ack, seconds, _FLEET)
            return self._committed(u, targets, acks, dropped, lagging, full, prints, unreplayable)

    def _delta(
        self, u: push.Update, bases: list[str], always: bool
    ) -> tuple[DeltaUpdate | None, Choice]:
        """`u` as a delta when every target's delta base (`bases`) is what
        this fleet pushed last and a delta is the cheaper way; None (a full
        update) otherwise (delta_push.PushedWeights.plan)."""
        from rollout_client.weights.delta_push import PushedWeights

        if self.pushed is None:
            self.pushed = PushedWeights()
        base = self.pushed.version
        has_base = bool(base) and all(b == base for b in bases)
        return self.pushed.plan(u, has_base, _FLEET, same_host=False, always=always)

    def _committed(
        self,
        u: push.Update,
        targets: list[Replica],
        acks: dict[str, pb.UpdateWeightsResponse],
        dropped: dict[str, str],
        lagging: dict[str, str],
        full: bool,
        prints: list[int] | None,
        unreplayable: str,
    ) -> FleetAck:
        """The fleet's bookkeeping once the commits are answered; `prints`
        is None when the source cannot be read again (`unreplayable` says why)."""
        before = self.version
        version = u.begin.weight_version
        if acks:
            self.replicas.set_version(version)
        for r in targets:
            if r.target in acks:
                self.replicas.observe(r, version)
            else:
                self.replicas.drop(r, dropped[r.target])
        if acks:
            for r in self.replicas:  # a new source: failed heals may try again at once
                r.heal_failures, r.heal_after = 0, 0.0
            previous = [a.previous_weight_version for a in acks.values()]
            if prints is None:
                self.ledger.forget(unreplayable, version, previous)
            else:
                self.ledger.record(u.tensors, prints, version, full, before, previous)
        if lagging and self._keeper is not None:
            self._keeper.nudge()
        return FleetAck(version=version, acks=acks, dropped=dropped, lagging=lagging)


class AsyncFleet:
    """Fleet for asyncio: the same routing, barrier and bookkeeping, each
    call run on a thread of its own pool (`max_threads`: the calls it runs
    at once), as AsyncRolloutClient.update_weights runs its push."""

    def __init__(self, targets: str | list[str], *, max_threads: int = 256, **kwargs: Any) -> None:
        self.fleet = Fleet(targets, **kwargs)
        self.threads = Threads(max_threads)

    async def __aenter__(self) -> AsyncFleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.threads.run(self.fleet.close)  # joins the keeper thread
        self.threads.close()

    async def generate(self, **kwargs: Any) -> pb.GenerateResponse:
        return await self.threads.run(self.fleet.generate, **kwargs)

    async def open_session(self, **kwargs: Any) -> AsyncFleetSession:
        session = await self.threads.run(self.fleet.open_session, **kwargs)
        return AsyncFleetSession(session, self.threads)

    async def update_weights(self, source: Any, version: str, **kwargs: Any) -> FleetAck:
        return await self.threads.run(self.fleet.update_weights, source, version, **kwargs)
