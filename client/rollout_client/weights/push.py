"""Sending an update to one server, three ways:

- one stream (UpdateWeights): begin, chunks, commit on one call;
- parallel uploads (BeginUpdate, UploadChunks on several channels at once,
  CommitUpdate), resuming the byte ranges a broken stream did not deliver;
- the same-host handoff (BeginUpdate with same_host): the bytes are written
  straight into the server's staging region, nothing but the calls over gRPC.

Chunk messages are serialized by hand (wire.py): the data is copied once,
into the message, instead of into a protobuf message and out again. Sources
are read lazily (sources.py). These are plain functions over sync channels;
push_async.py sends the same messages over the asyncio client's channel.
Each marks its commit just before sending it, and a push stopped before
that sends no more (interrupts.py).
"""

from __future__ import annotations

import functools
import mmap
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from rollout.v1 import rollout_pb2 as pb
from rollout.v1 import rollout_pb2_grpc
from rollout_client.calls.connection import Metadata
from rollout_client.weights.interrupts import PushState, Stopped

# Re-exported (`X as X`): the manifest check lived here until it got its own module.
from rollout_client.weights.manifest import ManifestMismatch as ManifestMismatch
from rollout_client.weights.manifest import describe as describe
from rollout_codecs import wire
from rollout_codecs.sources import SourceTensor

_SERVICE = "/rollout.v1.RolloutService/"
_COMMIT = pb.UpdateWeightsRequest(commit=pb.UpdateWeightsCommit()).SerializeToString()


class Progress(Protocol):
    """Where an update counts its bytes sent (a tqdm bar)."""

    def update(self, n: int) -> object: ...

    def close(self) -> None: ...


@dataclass
class Update:
    """What to send and how."""

    tensors: Sequence[SourceTensor]
    begin: pb.UpdateWeightsBegin
    chunk_bytes: int = 1 << 20
    progress: Progress | None = None
    timeout: float | None = None
    metadata: Metadata = None
    # The server takes TensorChunkBatch (GetServerInfo.accepts_chunk_batches).
    batch_chunks: bool = False
    # Whether the commit went out, and the way to stop the push (interrupts.py).
    state: PushState = field(default_factory=PushState)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def advance(self, n: int) -> None:
        if self.progress is not None:
            with self._lock:
                self.progress.update(n)


# What one TensorChunkBatch may hold (rollout.proto).
MAX_BATCH_CHUNKS = 1024

Piece = tuple[int, int, int]  # tensor index, offset, length
Chunk = tuple[int, int, bytes | memoryview]  # tensor index, offset, data


def pieces(u: Update) -> Iterator[Piece]:
    """Every chunk of the update, in order."""
    for i, t in enumerate(u.tensors):
        for off in range(0, t.nbytes, u.chunk_bytes):
            yield i, off, min(u.chunk_bytes, t.nbytes - off)


def groups(u: Update, items: Iterator[Piece]) -> Iterator[list[Piece]]:
    """The chunks as messages: each alone, or, where the server takes
    batches, runs of chunks under a quarter of the chunk size together, up
    to half of it (with up to 1024 chunks' headers, a batch stays smaller
    than a message of one whole chunk; gRPC costs as much per message as a
    few hundred KB take here)."""
    small = u.chunk_bytes // 4
    budget = u.chunk_bytes // 2
    group: list[Piece] = []
    size = 0
    for p in items:
        n = p[2]
        if not u.batch_chunks or n >= small:
            if group:
                yield group
                group, size = [], 0
            yield [p]
            continue
        if group and (size + n > budget or len(group) == MAX_BATCH_CHUNKS):
            yield group
            group, size = [], 0
        group.append(p)
        size += n
    if group:
        yield group


UPDATE_WEIGHTS = _SERVICE + "UpdateWeights"


def update_weights_steps(u: Update) -> Iterator[Callable[[], bytes]]:
    """The UpdateWeights stream, the one builder of both clients': begin,
    every chunk in order, commit, each as a step that makes its serialized
    message (reading the chunk's bytes, then counting them and releasing a
    tensor read to its end). The blocking push runs each step where it is,
    the asyncio push in a worker thread (a read may block: a file, a device
    copy). A stopped push ends here, without its commit (interrupts.py)."""
    yield pb.UpdateWeightsRequest(begin=u.begin).SerializeToString
    for group in groups(u, pieces(u)):
        if u.state.stopped:
            return
        yield functools.partial(_chunks_message, u, group)
    if u.state.committing():
        yield lambda: _COMMIT


def _chunks_message(u: Update, group: list[Piece]) -> bytes:
    message = update_weights_message(read(u, group))
    u.advance(sum(n for _, _, n in group))
    let_go(u, group)
    return message


def update_weights_requests(u: Update) -> Iterator[bytes]:
    """The serialized messages of an UpdateWeights stream (update_weights_steps,
    run in place). Call the method with request_serializer=None."""
    for step in update_weights_steps(u):
        yield step()


def read(u: Update, group: list[Piece]) -> list[Chunk]:
    """The bytes of a group of pieces."""
    return [(i, off, u.tensors[i].read(off, n)) for i, off, n in group]


def let_go(u: Update, group: list[Piece]) -> None:
    """Releases each tensor whose last piece is in `group` (read in order)."""
    for i, off, n in group:
        if off + n == u.tensors[i].nbytes:
            u.tensors[i].release()


def _batch(chunks: list[Chunk]) -> pb.TensorChunkBatch:
    return pb.TensorChunkBatch(
        chunks=[pb.TensorChunk(tensor_index=i, offset=o, data=bytes(d)) for i, o, d in chunks]
    )


def update_weights_message(chunks: list[Chunk]) -> bytes:
    """A serialized UpdateWeightsRequest: one chunk (its data copied once,
    wire.py), or a batch."""
    if len(chunks) == 1:
        return wire.update_weights_chunk(*chunks[0])
    out: bytes = pb.UpdateWeightsRequest(chunks=_batch(chunks)).SerializeToString()
    return out


def upload_message(update_id: str, chunks: list[Chunk]) -> bytes:
    """A serialized UploadChunksRequest: one chunk or a batch."""
    if len(chunks) == 1:
        return wire.upload_chunk(update_id, *chunks[0])
    request = pb.UploadChunksRequest(update_id=update_id, chunks=_batch(chunks))
    out: bytes = request.SerializeToString()
    return out


def one_stream(channel: grpc.Channel, u: Update) -> pb.UpdateWeightsResponse:
    """UpdateWeights: begin, every chunk in order, commit. Stopping the push
    cancels the call."""
    call: grpc.StreamUnaryMultiCallable[bytes, pb.UpdateWeightsResponse] = channel.stream_unary(
        UPDATE_WEIGHTS,
        request_serializer=None,  # the requests are serialized already
        response_deserializer=pb.UpdateWeightsResponse.FromString,
    )
    # A future, not the blocking call: the call must be cancelled when the
    # push is stopped, or gRPC's thread would go on sending what is left.
    future = call.future(update_weights_requests(u), timeout=u.timeout, metadata=u.metadata)
    u.state.on_stop(future.cancel)
    try:
        return future.result()
    except grpc.FutureCancelledError:
        raise Stopped from None


def parallel(
    channels: Sequence[grpc.Channel], u: Update, resume_attempts: int = 2
) -> pb.UpdateWeightsResponse:
    """BeginUpdate, the chunks spread over one UploadChunks stream per
    channel, CommitUpdate; ranges a broken stream did not deliver are sent
    again (GetUpdateStatus), up to `resume_attempts` times. Aborted on error."""
    stub = rollout_pb2_grpc.RolloutServiceStub(channels[0])
    opened = stub.BeginUpdate(
        pb.BeginUpdateRequest(begin=u.begin), timeout=u.timeout, metadata=u.metadata
    )
    uid = opened.update_id
    try:
        todo: Iterator[list[Piece]] = groups(u, pieces(u))
        for attempt in range(resume_attempts + 1):
            errors = _upload(channels, u, uid, todo)
            u.state.check()
            status = stub.GetUpdateStatus(
                pb.GetUpdateStatusRequest(update_id=uid), timeout=u.timeout, metadata=u.metadata
            )
            if not status.missing:
                break
            if attempt == resume_attempts:
                raise errors[0] if errors else RuntimeError("upload incomplete")
            todo = missing_groups(u, status)
        if not u.state.committing():
            raise Stopped
        return stub.CommitUpdate(
            pb.CommitUpdateRequest(update_id=uid), timeout=u.timeout, metadata=u.metadata
        ).result
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            u.state.stop()  # the upload threads end before the abort
        _abort(stub, uid, u)
        raise


def missing_groups(u: Update, status: pb.GetUpdateStatusResponse) -> Iterator[list[Piece]]:
    """The chunks of the byte ranges the server reports missing, as messages."""
    return groups(
        u,
        (
            (r.tensor_index, off, min(u.chunk_bytes, r.offset + r.length - off))
            for r in status.missing
            for off in range(r.offset, r.offset + r.length, u.chunk_bytes)
        ),
    )


def upload_step(u: Update, uid: str, group: list[Piece]) -> bytes:
    """One UploadChunks message (both clients'; the asyncio one makes it in
    a worker thread), its bytes counted."""
    message = upload_message(uid, read(u, group))
    u.advance(sum(n for _, _, n in group))
    return message


UPLOAD_CHUNKS = _SERVICE + "UploadChunks"


def _upload(
    channels: Sequence[grpc.Channel], u: Update, uid: str, todo: Iterator[list[Piece]]
) -> list[grpc.RpcError]:
    """One UploadChunks stream per channel, all pulling from `todo`."""
    lock = threading.Lock()
    errors: list[grpc.RpcError] = []

    def requests() -> Iterator[bytes]:
        while True:
            with lock:
                group = None if u.state.stopped else next(todo, None)
            if group is None:
                return
            yield upload_step(u, uid, group)

    def run(channel: grpc.Channel) -> None:
        call: grpc.StreamUnaryMultiCallable[bytes, pb.UploadChunksResponse] = channel.stream_unary(
            UPLOAD_CHUNKS,
            request_serializer=None,
            response_deserializer=pb.UploadChunksResponse.FromString,
        )
        try:
            call(requests(), timeout=u.timeout, metadata=u.metadata)
        except grpc.RpcError as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(ch,)) for ch in channels]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


class Regions:
    """The client's mappings of server staging regions, kept between
    updates: mapping a region afresh costs a page fault per page (about as
    long as the copy itself), so a trainer that pushes every step maps it
    once. A region that was replaced (new path, other size) is remapped."""

    def __init__(self) -> None:
        self._maps: dict[str, tuple[int, mmap.mmap]] = {}

    def view(self, path: str) -> memoryview:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            size = os.fstat(fd).st_size
            known = self._maps.get(path)
            if known is not None and known[0] == size:
                return memoryview(known[1])
            self.close()
            # MAP_POPULATE: the pages are mapped in one call, not faulted one by one.
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            mm = mmap.mmap(fd, size, flags=flags)
        finally:
            os.close(fd)
        self._maps[path] = (size, mm)
        return memoryview(mm)

    def close(self) -> None:
        for _, mm in self._maps.values():
            try:
                mm.close()
            except BufferError:
                pass  # a view is still alive; it is unmapped when it goes
        self._maps.clear()


def same_host(
    channel: grpc.Channel, u: Update, regions: Regions | None = None
) -> pb.UpdateWeightsResponse:
    """BeginUpdate(same_host), each tensor read straight into the server's
    staging region, CommitUpdate. Needs the server's host, /dev/shm and
    user; nothing but the calls goes over gRPC."""
    stub = rollout_pb2_grpc.RolloutServiceStub(channel)
    opened = stub.BeginUpdate(
        pb.BeginUpdateRequest(begin=u.begin, same_host=True),
        timeout=u.timeout,
        metadata=u.metadata,
    )
    try:
        fill_region(u, opened.shared_staging, regions)
        if not u.state.committing():
            raise Stopped
        return stub.CommitUpdate(
            pb.CommitUpdateRequest(update_id=opened.update_id),
            timeout=u.timeout,
            metadata=u.metadata,
        ).result
    except BaseException:
        _abort(stub, opened.update_id, u)
        raise


def fill_region(u: Update, staging: pb.SharedStaging, regions: Regions | None = None) -> None:
    """Each tensor read straight into the server's staging region (both
    clients' same-host push; the asyncio one runs it in a worker thread).
    Raises Stopped once the push is stopped."""
    own = regions is None
    regions = regions or Regions()
    view = regions.view(staging.path)
    try:
        step = u.chunk_bytes << 4
        for t, at in zip(u.tensors, staging.tensor_offsets):
            for off in range(0, t.nbytes, step):
                u.state.check()
                n = min(step, t.nbytes - off)
                t.read_into(off, view[at + off : at + off + n])
                u.advance(n)
            t.release()
    finally:
        view.release()
        if own:
            regions.close()


def _abort(stub: rollout_pb2_grpc.RolloutServiceStub, uid: str, u: Update) -> None:
    try:
        stub.AbortUpdate(pb.AbortUpdateRequest(update_id=uid), timeout=10, metadata=u.metadata)
    except grpc.RpcError:
        pass  # gone already, or the server is: nothing to abort


DEFAULT_CHUNK_BYTES = 1 << 20


def prepare(
    source: Any,
    version: str,
    manifest: Sequence[pb.TensorSpec] | None,
    *,
    pause_mode: pb.PauseMode = pb.PAUSE_MODE_WAIT,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    checksum: bool = False,
    drain_timeout_seconds: float | None = None,
    adapter: pb.AdapterTarget | None = None,
) -> Update:
    """An Update of `source` (see sources.open_source), checked against the
    manifest; no tensor bytes are read yet unless `checksum`. With `adapter`
    it loads that LoRA adapter instead (the server checks its tensors against
    the base modules; pass manifest=None)."""
    from rollout_codecs.sources import open_source

    tensors = open_source(source)
    begin = pb.UpdateWeightsBegin(
        weight_version=version,
        tensors=describe(tensors, manifest, checksum),
        pause_mode=pause_mode,
        adapter=adapter,
    )
    if drain_timeout_seconds is not None:
        begin.drain_timeout_seconds = drain_timeout_seconds
    return Update(tensors=tensors, begin=begin, chunk_bytes=chunk_bytes)


def send(
    u: Update,
    channel: grpc.Channel,
    new_channel: Callable[[], grpc.Channel],
    streams: int = 1,
    on_host: bool = False,
    regions: Regions | None = None,
) -> pb.UpdateWeightsResponse:
    """Sends `u` the chosen way; `new_channel()` makes the extra channels
    (separate connections) that parallel uploads use; `regions` keeps the
    same-host mappings between updates."""
    if on_host:
        return same_host(channel, u, regions)
    if streams <= 1:
        return one_stream(channel, u)
    channels = [new_channel() for _ in range(streams)]
    try:
        return parallel(channels, u)
    finally:
        for ch in channels:
            ch.close()
