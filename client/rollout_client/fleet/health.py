"""What a Fleet knows of each replica, and how it keeps that true.

A pod restarted by Kubernetes (after an OOM kill, say) comes back at the same
address on its initial weights while the trainer's Fleet lives on. Two things
keep that from ever serving a rollout or shrinking the fleet for good:

- The keeper thread probes every replica every `probe_seconds`: health, then
  GetServerInfo's version. One that stops answering is dropped; a dropped one
  is asked again over a new connection (its channel may sit in gRPC's
  reconnect backoff, up to 120 s, long after the server is back) and gets a
  new client once it answers.
- A replica that answers on another version than the fleet's is healed: the
  fleet pushes it what it pushed the others, from the trainer's own sources
  (the Ledger), as one staged update, before it is routed to again.

Why the trainer's sources and not a peer replica's bytes: replicas have no
server-to-server path (no RPC reads weights out of a server, and a server
that pulled from a peer would need the peer's address and credentials), and
the Fleet stays client-side only. The cost: the fleet keeps the last
update's source reachable until the next update replaces it (a file stays
open; in-memory tensors stay referenced: pass heal_from_source=False to keep
nothing), and a source changed in place since its push cannot heal. The
fleet notices: it fingerprints each tensor as it sends it and compares the
heal's fingerprints before the commit, so a heal with other bytes is aborted,
never served; the replica then waits for the next full update.

Only replicas that lag are healed: on the servers' initial version, on one
this fleet pushed, or on one its updates replaced. A replica on any other
version was updated by another client; the fleet leaves it out and reports
it rather than fight over it (a full update, or refresh(), takes it back).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2_grpc

from rollout.v1 import rollout_pb2 as pb
from rollout_client.calls import core
from rollout_client.calls.connection import Metadata
from rollout_client.client import RolloutClient, RolloutError
from rollout_client.fleet import staging
from rollout_client.fleet.replicas import Failure, Replica, Replicas, gone
from rollout_client.weights import push
from rollout_codecs.sources import SourceTensor

log = logging.getLogger("rollout_client.fleet")

PROBE_TIMEOUT = 5.0  # seconds, each probe call


class Ledger:
    """What brings a replica to the fleet's version: for every tensor pushed
    since the last full update (every parameter), the newest source tensor
    and its fingerprint. After a full update any version heals; partial ones
    heal only the versions of their `chain` (the one the first was pushed
    onto, and each since): those hold every tensor that none of them sent."""

    def __init__(self, initial_version: str) -> None:
        self.known = {initial_version, ""}  # versions a lagging replica may be on
        self.version: str | None = None
        self.full = False
        self.chain: set[str] = set()
        self.tensors: dict[str, tuple[SourceTensor, int]] = {}
        self.spoiled = ""

    def record(
        self,
        tensors: Sequence[SourceTensor],
        prints: Sequence[int],
        version: str,
        full: bool,
        previous: str | None,
        replaced: Iterable[str],
    ) -> None:
        """An update of `tensors` to `version`, pushed onto `previous` (None:
        the fleet had no version yet)."""
        if full or self.version != previous:
            onto = set() if full or previous is None else {previous}
            self.tensors, self.full, self.chain = {}, full, onto
        self.tensors.update({t.name: (t, p) for t, p in zip(tensors, prints)})
        self.version, self.spoiled = version, ""
        self.chain.add(version)
        self.known.update([version, *replaced])

    def forget(self, why: str, version: str, replaced: Iterable[str]) -> None:
        """An update whose source cannot be read again: nothing heals to it."""
        self.tensors, self.full, self.chain, self.version = {}, False, set(), None
        self.spoiled = f"the update to {version!r} cannot heal: {why}"
        self.known.update([version, *replaced])

    def why_not(self, replica_version: str, fleet_version: str | None) -> str:
        """Why a replica on `replica_version` cannot be healed ("" if it can)."""
        if replica_version not in self.known:
            return (
                f"serves {replica_version!r}, which this fleet neither pushed nor replaced: "
                "another client updated it (a full update or refresh() takes it back)"
            )
        if self.spoiled:
            return self.spoiled
        if self.version is None or self.version != fleet_version:
            return f"{fleet_version!r} was not pushed by this fleet: nothing to heal from"
        if not self.full and replica_version not in self.chain:
            return (
                f"serves {replica_version!r}; the updates since {sorted(self.chain)} were "
                "partial and cannot bring it to the fleet's version (the next full update will)"
            )
        return ""

    def update(self, timeout: float) -> tuple[push.Update, list[int]]:
        """The heal: every recorded tensor, to the recorded version."""
        tensors = [t for t, _ in self.tensors.values()]
        begin = pb.UpdateWeightsBegin(
            weight_version=self.version, tensors=push.describe(tensors, None)
        )
        u = push.Update(tensors=tensors, begin=begin, timeout=timeout)
        return u, [p for _, p in self.tensors.values()]


def replayable(source: Any, keep: bool) -> tuple[Any, str]:
    """`source` (an iterable made a list, to be read again) and "", or why
    the fleet cannot read it again in a heal."""
    if not keep:
        return source, "heal_from_source=False"
    if isinstance(source, (str, os.PathLike)):
        return source, ""
    if isinstance(source, Mapping):
        tensors: Iterable[object] = source.values()
    elif hasattr(source, "named_parameters"):
        tensors = (t for _, t in source.named_parameters())
    else:
        source = list(source)
        tensors = (t for _, t in source)
    if any(hasattr(t, "full_tensor") for t in tensors):
        # Gathering a DTensor is a collective: a heal in a background thread
        # cannot join one that the other ranks are not making.
        return source, "its tensors are distributed (DTensor)"
    return source, ""


class Keeper:
    """The fleet's background thread: `check()` every `interval` seconds, and
    at once when nudged (a replica refused the fleet's version)."""

    def __init__(self, check: Callable[[], None], interval: float) -> None:
        self._check = check
        self.interval = interval
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="fleet-keeper", daemon=True)
        self._thread.start()

    def nudge(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=PROBE_TIMEOUT)

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stopped:
                return
            try:
                self._check()
            except Exception:
                if not self._stopped:  # a channel closed under it is no news
                    log.exception("fleet keeper: a check failed")


def _serving(channel: grpc.Channel, metadata: Metadata) -> bool:
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        status: int = stub.Check(core.HEALTH_CHECK, timeout=PROBE_TIMEOUT, metadata=metadata).status
    except grpc.RpcError:
        return False
    return status == core.SERVING


def probe(replicas: Replicas, r: Replica, timeout: float) -> None:
    """Drops `r` when it is not SERVING; records its version when it is. A
    dropped replica is asked over a new connection, and given a new client
    (with the fleet's call `timeout`) once it answers (not while a call still
    holds the old one)."""
    options = r.client.options
    if r.alive:
        if not _serving(r.client.channel, options.metadata()):
            replicas.drop(r, "not SERVING (health check)")
            return
    else:
        if r.outstanding:
            return
        channel = options.channel(r.target, aio=False, own_connection=True)
        try:
            if not _serving(channel, options.metadata()):
                return
        finally:
            channel.close()
        old, r.client = r.client, RolloutClient(r.target, timeout=timeout, options=options)
        old.close()
    try:
        info = r.client.server_info(PROBE_TIMEOUT)
    except RolloutError as e:
        replicas.drop(r, e)
        return
    replicas.observe(r, "" if info.degraded else info.weight_version)


def heal(
    replicas: Replicas,
    r: Replica,
    ledger: Ledger,
    updating: threading.RLock,
    timeout: float,
    retry_interval: float,
) -> None:
    """Brings lagging `r` to the fleet's version from the Ledger: one staged
    update, committed only if every tensor's fingerprint is the one pushed
    to the others. Under the fleet's update lock (`updating`), after reading
    `r`'s version again: an update may have moved either side meanwhile. A
    failed heal waits 2**n `retry_interval`s before the next."""
    if time.monotonic() < r.heal_after:
        return
    with updating:
        target = replicas.version
        try:
            info = r.client.server_info(PROBE_TIMEOUT)
        except RolloutError as e:
            replicas.drop(r, e)
            return
        now = "" if info.degraded else info.weight_version
        why = "" if now == target else ledger.why_not(now, target)
        if now == target or why:
            replicas.observe(r, now, why)
            return
        assert target is not None  # why_not refuses a fleet without a version
        t0 = time.monotonic()
        failure = _push(ledger, r, target, timeout)
        if failure:
            _failed(replicas, r, now, failure, retry_interval)
            return
        r.heal_failures = 0
        replicas.observe(r, target)
        log.info(
            "replica %s healed: %r -> %r in %.2f s", r.target, now, target, time.monotonic() - t0
        )


def _push(ledger: Ledger, r: Replica, target: str, timeout: float) -> Failure | None:
    """The Ledger's update staged on `r`, checked and committed; why not."""
    u, expected = ledger.update(timeout)
    prints: list[int] = []
    try:
        opened = staging.stage(u, [r], timeout, fingerprints=prints)
    except staging.FleetUpdateError as e:
        return _heal_failed(e.errors[r.target])
    if prints != expected:
        staging.abort(r, opened[r.target])
        changed = next(t.name for t, a, b in zip(u.tensors, prints, expected) if a != b)
        ledger.spoiled = (
            f"the source of {target!r} changed since it was pushed ({changed}; updated "
            "in place?): it cannot heal, and was not committed (the next full update will)"
        )
        return Failure(ledger.spoiled)
    _, failed = staging.commit_all([r], opened, timeout)
    return _heal_failed(failed[r.target]) if failed else None


def _heal_failed(why: str) -> Failure:
    return Failure(f"heal failed: {why}", getattr(why, "code", None))


def _failed(
    replicas: Replicas, r: Replica, version: str, why: Failure, retry_interval: float
) -> None:
    """A heal that failed: `r` is dropped if it stopped answering (by its
    status code), else left lagging, and not tried again for 2**n rounds."""
    if gone(why):
        replicas.drop(r, why)
    else:
        replicas.observe(r, version, why)
    r.heal_failures += 1
    r.heal_after = time.monotonic() + min(300.0, retry_interval * 2**r.heal_failures)
