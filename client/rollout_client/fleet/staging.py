"""One staged update on several replicas at once: the fleet's update and its
heal of a lagging replica both go through here.

The source is read once and each chunk goes to every replica (BeginUpdate,
one UploadChunks stream each, fed from one reader); the barrier
(GetUpdateStatus) checks that every replica holds every byte before anything
is committed, and a failure before the commit aborts the update everywhere.
While reading, each tensor's fingerprint (a CRC of the bytes sent) can be
taken: the fleet keeps them to tell, at a later heal, whether its source
still holds the same bytes.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence

import grpc

from rollout.v1 import rollout_pb2 as pb
from rollout.v1 import rollout_pb2_grpc
from rollout_client.calls.connection import Metadata
from rollout_client.fleet.replicas import Failure, Replica, gone
from rollout_client.weights import push


def _checksum() -> Callable[[bytes | memoryview, int], int]:
    """CRC-32C when its optional package is there (about 13 GB/s here),
    else zlib's CRC-32 (always there, about 6): imported on first use, so
    that importing the client loads no optional package."""
    try:
        from crc32c import crc32c

        return crc32c
    except ImportError:
        from zlib import crc32

        return crc32


class FleetUpdateError(Exception):
    """The update failed before the commit and was aborted everywhere."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__(
            "fleet update aborted everywhere: " + "; ".join(f"{t}: {e}" for t, e in errors.items())
        )
        self.errors = errors


def stub(r: Replica) -> rollout_pb2_grpc.RolloutServiceStub:
    return rollout_pb2_grpc.RolloutServiceStub(r.client.channel)


def metadata(r: Replica) -> Metadata:
    return r.client.options.metadata()


def stage(
    u: push.Update,
    replicas: Sequence[Replica],
    timeout: float,
    *,
    before_commit: Callable[[], None] | None = None,
    on_unavailable: Callable[[Replica, str], None] = lambda r, why: None,
    fingerprints: list[int] | None = None,
) -> dict[str, str]:
    """Opens `u` on every replica and uploads it; returns target -> update_id
    once every replica holds every byte. Otherwise aborts it everywhere,
    calls `on_unavailable` for the replicas that stopped answering and raises
    FleetUpdateError. `fingerprints`, when given, gets each tensor's CRC."""
    opened: dict[str, str] = {}
    errors: dict[str, str] = {}
    try:
        for r in replicas:
            try:
                begin = pb.BeginUpdateRequest(begin=u.begin)
                opened[r.target] = (
                    stub(r).BeginUpdate(begin, timeout=timeout, metadata=metadata(r)).update_id
                )
            except grpc.RpcError as e:
                errors[r.target] = Failure.of(e)
        if not errors:
            errors = _fan_out(u, [(r, opened[r.target]) for r in replicas], fingerprints)
        if not errors and before_commit is not None:
            before_commit()
        if not errors:
            errors = _check_staged(replicas, opened, timeout)
        if errors:
            raise FleetUpdateError(errors)
    except BaseException:
        for r in replicas:
            if r.target in opened:
                abort(r, opened[r.target])
        for r in replicas:
            if gone(errors.get(r.target)):
                on_unavailable(r, errors[r.target])
        raise
    return opened


def commit_all(
    replicas: Sequence[Replica], opened: dict[str, str], timeout: float
) -> tuple[dict[str, pb.UpdateWeightsResponse], dict[str, str]]:
    """CommitUpdate on every replica at once: (acks, target -> error)."""
    acks: dict[str, pb.UpdateWeightsResponse] = {}
    failed: dict[str, str] = {}

    def commit(r: Replica) -> None:
        try:
            request = pb.CommitUpdateRequest(update_id=opened[r.target])
            acks[r.target] = (
                stub(r).CommitUpdate(request, timeout=timeout, metadata=metadata(r)).result
            )
        except grpc.RpcError as e:
            failed[r.target] = Failure.of(e)

    threads = [threading.Thread(target=commit, args=(r,)) for r in replicas]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return acks, failed


def abort(r: Replica, uid: str) -> None:
    try:
        stub(r).AbortUpdate(pb.AbortUpdateRequest(update_id=uid), timeout=10, metadata=metadata(r))
    except grpc.RpcError:
        pass


def _fan_out(
    u: push.Update, targets: list[tuple[Replica, str]], fingerprints: list[int] | None
) -> dict[str, str]:
    """Reads every chunk once and sends it to every replica, one upload
    stream each; a replica whose stream fails stops getting chunks."""
    # A message's worth of chunks on its way to the upload streams (push.groups).
    queues: dict[str, queue.Queue[list[push.Chunk] | None]] = {
        r.target: queue.Queue(maxsize=8) for r, _ in targets
    }
    errors: dict[str, str] = {}

    def upload(r: Replica, uid: str) -> None:
        q = queues[r.target]

        def requests() -> Iterator[bytes]:
            while (chunks := q.get()) is not None:
                yield push.upload_message(uid, chunks)

        call: grpc.StreamUnaryMultiCallable[bytes, pb.UploadChunksResponse] = (
            r.client.channel.stream_unary(
                "/rollout.v1.RolloutService/UploadChunks",
                request_serializer=None,
                response_deserializer=pb.UploadChunksResponse.FromString,
            )
        )
        try:
            call(requests(), timeout=u.timeout, metadata=metadata(r))
        except grpc.RpcError as e:
            errors[r.target] = Failure.of(e)
            while q.get() is not None:  # keep the reader from blocking on us
                pass

    threads = [threading.Thread(target=upload, args=(r, uid)) for r, uid in targets]
    for t in threads:
        t.start()
    crc_of = _checksum() if fingerprints is not None else None
    crcs = [0] * len(u.tensors)
    try:
        for group in push.groups(u, push.pieces(u)):
            chunks = push.read(u, group)
            if crc_of is not None:  # set when fingerprints are asked for
                for i, _, data in chunks:
                    crcs[i] = crc_of(data, crcs[i])
            for q in queues.values():
                q.put(chunks)
            push.let_go(u, group)
        if fingerprints is not None:
            fingerprints.extend(crcs)
    finally:
        for q in queues.values():
            q.put(None)
        for t in threads:
            t.join()
    return errors


def _check_staged(
    replicas: Sequence[Replica], opened: dict[str, str], timeout: float
) -> dict[str, str]:
    """The barrier: every replica holds every byte of its update."""
    errors: dict[str, str] = {}
    for r in replicas:
        try:
            status = stub(r).GetUpdateStatus(
                pb.GetUpdateStatusRequest(update_id=opened[r.target]),
                timeout=min(timeout, 30),
                metadata=metadata(r),
            )
            if status.missing:
                errors[r.target] = Failure(f"{len(status.missing)} byte ranges missing")
        except grpc.RpcError as e:
            errors[r.target] = Failure.of(e)
    return errors
