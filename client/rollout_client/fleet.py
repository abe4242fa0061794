"""Several replicas of the service as one, from the trainer's side.

- Generate goes to the live replica with the fewest calls outstanding, or,
  with `prefix_affinity_tokens`, always to the same replica for the same
  prompt prefix (its prefix cache stays warm); only replicas serving the
  fleet's current version are chosen.
- One weight update for all, with a version barrier: the source is read
  once and its chunks go to every replica (BeginUpdate + UploadChunks: the
  staged update); only when every replica holds every byte is the update
  committed everywhere (CommitUpdate). If any replica fails before the
  commit, the update is aborted everywhere: no replica serves it.
- A replica that stops answering (UNAVAILABLE) is dropped and reported, never
  waited on: every call carries a deadline.

The commits themselves are separate calls: a replica that dies between the
final check and its own commit leaves the others on the new version. The
acknowledgement then lists who has what, and Generate keeps to the replicas
on the new version.

Replicas come from a list of targets or from one DNS name resolving to
several addresses (a Kubernetes headless Service).
"""

from __future__ import annotations

import collections
import queue
import socket
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any

import grpc

from rollout.v1 import rollout_pb2 as pb
from rollout.v1 import rollout_pb2_grpc
from rollout_client import push, wire
from rollout_client.client import RolloutClient, RolloutError


def resolve(targets: str | list[str]) -> list[str]:
    """A list of targets as given, or every address a `name:port` resolves to."""
    if not isinstance(targets, str):
        return list(targets)
    name, _, port = targets.rpartition(":")
    infos = socket.getaddrinfo(name, int(port), type=socket.SOCK_STREAM)
    addresses = sorted({info[4][0] for info in infos})
    return [f"[{a}]:{port}" if ":" in a else f"{a}:{port}" for a in addresses]


@dataclass
class Replica:
    target: str
    client: RolloutClient
    version: str | None = None
    outstanding: int = 0
    served: int = 0
    alive: bool = True
    error: str = ""


@dataclass
class FleetAck:
    """The outcome of a fleet update: each replica's acknowledgement, and the
    replicas dropped on the way (target -> why)."""

    version: str
    acks: dict[str, pb.UpdateWeightsResponse]
    dropped: dict[str, str] = field(default_factory=dict)


class FleetUpdateError(Exception):
    """The update failed before the commit and was aborted everywhere."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__(
            "fleet update aborted everywhere: " + "; ".join(f"{t}: {e}" for t, e in errors.items())
        )
        self.errors = errors


class Fleet:
    """Replicas of one model behind one client."""

    def __init__(
        self,
        targets: str | list[str],
        *,
        prefix_affinity_tokens: int = 0,
        timeout: float = 600.0,
        **options: Any,
    ) -> None:
        self.prefix_affinity_tokens = prefix_affinity_tokens
        self.replicas = [
            Replica(t, RolloutClient(t, timeout=timeout, **options)) for t in resolve(targets)
        ]
        self._lock = threading.Lock()
        self.version: str | None = None

    def close(self) -> None:
        for r in self.replicas:
            r.client.close()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def refresh(self, timeout: float = 10.0) -> None:
        """Reads every live replica's version; the fleet's is the most common."""
        for r in self._live():
            try:
                r.version = r.client.server_info(timeout).weight_version
            except RolloutError as e:
                self._drop(r, e)
        versions = collections.Counter(r.version for r in self._live())
        self.version = versions.most_common(1)[0][0] if versions else None

    def _live(self) -> list[Replica]:
        return [r for r in self.replicas if r.alive]

    def _drop(self, r: Replica, why: Exception | str) -> None:
        with self._lock:
            r.alive, r.error = False, str(why)

    def _pick(self, prompt_ids) -> Replica:
        with self._lock:
            live = self._live()
            current = [r for r in live if r.version == self.version] or live
            if not current:
                raise RolloutError(grpc.StatusCode.UNAVAILABLE, "no live replica in the fleet")
            if self.prefix_affinity_tokens and prompt_ids:
                key = ",".join(map(str, prompt_ids[: self.prefix_affinity_tokens])).encode()
                r = sorted(current, key=lambda x: x.target)[zlib.crc32(key) % len(current)]
            else:
                r = min(current, key=lambda x: x.outstanding)
            r.outstanding += 1
            return r

    def generate(self, **kwargs: Any) -> pb.GenerateResponse:
        """RolloutClient.generate on one replica (see the module docstring)."""
        if self.version is None:
            self.refresh()
        for _ in range(len(self.replicas)):
            r = self._pick(kwargs.get("prompt_token_ids"))
            try:
                response = r.client.generate(**kwargs)
                r.served += 1
                return response
            except RolloutError as e:
                if e.code != grpc.StatusCode.UNAVAILABLE:
                    raise
                self._drop(r, e)
            finally:
                with self._lock:
                    r.outstanding -= 1
        raise RolloutError(grpc.StatusCode.UNAVAILABLE, "no live replica in the fleet")

    def update_weights(
        self,
        source: Any,
        version: str,
        *,
        pause_mode: int = pb.PAUSE_MODE_WAIT,
        chunk_bytes: int = push.DEFAULT_CHUNK_BYTES,
        checksum: bool = False,
        drain_timeout_seconds: float | None = None,
        timeout: float = 600.0,
        before_commit=None,
    ) -> FleetAck:
        """One update for every live replica, committed only once all of them
        hold it (see the module docstring). `before_commit()` runs between
        staging and the commit (tests use it to kill a replica)."""
        live = self._live()
        if not live:
            raise RolloutError(grpc.StatusCode.UNAVAILABLE, "no live replica in the fleet")
        u = push.prepare(
            source,
            version,
            live[0].client.server_info(timeout).parameters,
            pause_mode=pause_mode,
            chunk_bytes=chunk_bytes,
            checksum=checksum,
            drain_timeout_seconds=drain_timeout_seconds,
        )
        u.timeout = timeout
        opened: dict[str, str] = {}  # target -> update_id
        errors: dict[str, str] = {}
        try:
            for r in live:
                try:
                    opened[r.target] = (
                        _stub(r)
                        .BeginUpdate(
                            pb.BeginUpdateRequest(begin=u.begin), timeout=timeout, metadata=_md(r)
                        )
                        .update_id
                    )
                except grpc.RpcError as e:
                    errors[r.target] = f"{e.code().name}: {e.details()}"
            if not errors:
                errors = _fan_out(u, [(r, opened[r.target]) for r in live])
            if not errors and before_commit is not None:
                before_commit()
            if not errors:
                errors = _check_staged(live, opened, timeout)
            if errors:
                raise FleetUpdateError(errors)
        except BaseException:
            for r in live:
                if r.target in opened:
                    _abort(r, opened[r.target])
            for r in live:
                if r.target in errors and "UNAVAILABLE" in errors[r.target]:
                    self._drop(r, errors[r.target])
            raise
        return self._commit_all(live, opened, version, timeout)

    def _commit_all(self, live, opened, version: str, timeout: float) -> FleetAck:
        acks: dict[str, pb.UpdateWeightsResponse] = {}
        dropped: dict[str, str] = {}

        def commit(r: Replica) -> None:
            try:
                acks[r.target] = (
                    _stub(r)
                    .CommitUpdate(
                        pb.CommitUpdateRequest(update_id=opened[r.target]),
                        timeout=timeout,
                        metadata=_md(r),
                    )
                    .result
                )
                r.version = version
            except grpc.RpcError as e:
                dropped[r.target] = f"{e.code().name}: {e.details()}"
                self._drop(r, dropped[r.target])

        threads = [threading.Thread(target=commit, args=(r,)) for r in live]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if acks:
            self.version = version
        return FleetAck(version=version, acks=acks, dropped=dropped)


def _stub(r: Replica):
    return rollout_pb2_grpc.RolloutServiceStub(r.client.channel)


def _md(r: Replica):
    return r.client.options.metadata()


def _abort(r: Replica, uid: str) -> None:
    try:
        _stub(r).AbortUpdate(pb.AbortUpdateRequest(update_id=uid), timeout=10, metadata=_md(r))
    except grpc.RpcError:
        pass


def _fan_out(u: push.Update, targets: list[tuple[Replica, str]]) -> dict[str, str]:
    """Reads every chunk once and sends it to every replica, one upload
    stream each; a replica whose stream fails stops getting chunks."""
    queues = {r.target: queue.Queue(maxsize=8) for r, _ in targets}
    errors: dict[str, str] = {}

    def upload(r: Replica, uid: str) -> None:
        q = queues[r.target]

        def requests():
            while (item := q.get()) is not None:
                i, off, data = item
                yield wire.upload_chunk(uid, i, off, data)

        call = r.client.channel.stream_unary(
            "/rollout.v1.RolloutService/UploadChunks",
            request_serializer=None,
            response_deserializer=pb.UploadChunksResponse.FromString,
        )
        try:
            call(requests(), timeout=u.timeout, metadata=_md(r))
        except grpc.RpcError as e:
            errors[r.target] = f"{e.code().name}: {e.details()}"
            while q.get() is not None:  # keep the reader from blocking on us
                pass

    threads = [threading.Thread(target=upload, args=(r, uid)) for r, uid in targets]
    for t in threads:
        t.start()
    try:
        for i, t in enumerate(u.tensors):
            for off, data in t.chunks(u.chunk_bytes):
                for q in queues.values():
                    q.put((i, off, data))
    finally:
        for q in queues.values():
            q.put(None)
        for t in threads:
            t.join()
    return errors


def _check_staged(live: list[Replica], opened: dict[str, str], timeout: float) -> dict[str, str]:
    """The barrier: every replica holds every byte of its update."""
    errors = {}
    for r in live:
        try:
            status = _stub(r).GetUpdateStatus(
                pb.GetUpdateStatusRequest(update_id=opened[r.target]),
                timeout=min(timeout, 30),
                metadata=_md(r),
            )
            if status.missing:
                errors[r.target] = f"{len(status.missing)} byte ranges missing"
        except grpc.RpcError as e:
            errors[r.target] = f"{e.code().name}: {e.details()}"
    return errors


class AsyncFleet:
    """Fleet for asyncio: the same routing, barrier and bookkeeping, each
    call run in a thread (as AsyncRolloutClient.update_weights does)."""

    def __init__(self, targets: str | list[str], **kwargs: Any) -> None:
        self.fleet = Fleet(targets, **kwargs)

    async def __aenter__(self) -> AsyncFleet:
        return self

    async def __aexit__(self, *exc) -> None:
        self.fleet.close()

    async def generate(self, **kwargs: Any) -> pb.GenerateResponse:
        import asyncio

        return await asyncio.to_thread(self.fleet.generate, **kwargs)

    async def update_weights(self, source: Any, version: str, **kwargs: Any) -> FleetAck:
        import asyncio

        return await asyncio.to_thread(self.fleet.update_weights, source, version, **kwargs)
