"""The staging region: a shared-memory file in /dev/shm that holds an update's
bytes between the gRPC stream (this server) and the vLLM workers (which map it
by name with `SegmentReader`).

It is kept and reused between updates: writing into already-touched memory
runs at memcpy speed, while a fresh segment pays a page fault per page (about
ten times slower on these machines). It grows when an update needs more.

Made to share a host with other servers and users:
- Names are random (PREFIX + 16 hex digits): nobody can predict, pre-create
  or squat on the next one.
- The owning server holds an exclusive flock on the segment for as long as it
  lives; the kernel drops the lock when the server dies, however it dies.
  `remove_stale_segments` unlinks the unlocked ones. (PIDs would not do:
  containers that share /dev/shm have their own, overlapping PID spaces.)
- Mode 0600: only the server's user can open it.
- Its capacity is reserved with posix_fallocate when it is created. tmpfs
  hands out pages lazily: without the reservation a too-small /dev/shm shows
  up later as SIGBUS (exit -7, no message) on the first write past its size.
  With it, creation fails at once with StagingSpaceError, which says what to
  change. The reservation commits the memory then, prefaulted or not.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import logging
import mmap
import os
import secrets
import shutil
import stat
import time
import weakref

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
PREFIX = "rollout-staging-"
# Linux 5.14+; Python 3.11's mmap module lacks the name.
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
# A server creates its segment, then locks it: a cleaner that comes between
# finds it unlocked and still empty. Empty segments younger than this are left.
_CREATING_SECONDS = 60.0
# What vLLM itself checks for in /dev/shm at start (its message queues).
_VLLM_SHM_BYTES = 240 << 20
_MiB = 1 << 20
# Tensors start on this alignment inside a region (plan.py, delta_base.py).
ALIGN = 64


class StagingSpaceError(OSError):
    """/dev/shm cannot hold the staging region: says how much is needed,
    how much is free and what to change."""

    def __init__(self, needed: int, free: int, reason: str = "") -> None:
        self.needed, self.free = needed, free
        want = -(-(needed + _VLLM_SHM_BYTES + 16 * _MiB) // (1 << 30))
        super().__init__(
            errno.ENOSPC,
            f"the staging region for weight updates needs {_size(needed)} in {SHM_DIR}, "
            f"which has {_size(free)} free{reason}. Give {SHM_DIR} at least "
            f"{want} GiB (vLLM needs about {_VLLM_SHM_BYTES // _MiB} MiB there too): Docker "
            f"`--shm-size={want}g`; Kubernetes: an emptyDir volume with `medium: Memory` and "
            f"`sizeLimit: {want}Gi` mounted at {SHM_DIR}. Or lower `--max-update-bytes`, which "
            "bounds the region (below the model's size only partial updates fit).",
        )

    def __str__(self) -> str:
        return self.strerror or ""  # without OSError's "[Errno 28]" (always set above)


def _size(n: int) -> str:
    for unit, name in ((1 << 30, "GiB"), (_MiB, "MiB"), (1 << 10, "KiB")):
        if n >= unit:
            return f"{n / unit:.1f} {name}"
    return f"{n} bytes"


def shm_free_bytes() -> int:
    return shutil.disk_usage(SHM_DIR).free


class _Segment:
    """One segment: created, locked, reserved and mapped, or nothing left."""

    def __init__(self, size: int) -> None:
        free = shm_free_bytes()
        if size > free:  # refuse before allocating gigabytes only to undo them
            raise StagingSpaceError(size, free)
        self.name = PREFIX + secrets.token_hex(8)
        self.path = os.path.join(SHM_DIR, self.name)
        self.size = size
        self.touched = False
        self.fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        try:
            # Blocking: a cleaner may hold the lock for a moment (see above).
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            os.posix_fallocate(self.fd, 0, size)
            self.mm = mmap.mmap(self.fd, size)
        except BaseException as e:
            os.unlink(self.path)
            os.close(self.fd)
            if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.ENOMEM):
                reason = " (out of memory: a container's memory limit counts /dev/shm too)"
                raise StagingSpaceError(
                    size, shm_free_bytes(), reason if e.errno == errno.ENOMEM else ""
                ) from e
            raise
        self.view = memoryview(self.mm)
        _live.add(self)

    def prefault(self) -> None:
        try:
            # The kernel faults every page in, about twice as fast as touching.
            self.mm.madvise(_MADV_POPULATE_WRITE)
        except OSError:  # kernel before 5.14
            _touch(self.view)
        self.touched = True

    def close(self) -> None:
        # Unlinked first, so no cleaner ever sees this name unlocked.
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        _live.discard(self)
        try:
            # Views callers still hold of it now raise ValueError when used.
            self.view.release()
            self.mm.close()
        except BufferError:
            # A slice or export of the view is still alive (memoryview
            # slices, torch.frombuffer): the kernel unmaps the pages when the
            # last of them is freed; nothing can point into freed memory.
            log.warning(
                "staging segment %s (%s) is still referenced; its memory is freed "
                "when the last view of it is",
                self.name,
                _size(self.size),
            )
        os.close(self.fd)

    def forget_in_child(self) -> None:
        """In a forked child (vLLM forks its engine core from this server):
        drop the inherited fd and mapping, so that the child holds neither the
        lock nor the memory of a segment the server later replaces."""
        try:
            self.view.release()
            self.mm.close()
        except BufferError:
            pass
        os.close(self.fd)


_live: weakref.WeakSet[_Segment] = weakref.WeakSet()


def _forget_all_in_child() -> None:
    for seg in list(_live):
        seg.forget_in_child()
    _live.clear()


os.register_at_fork(after_in_child=_forget_all_in_child)


class StagingRegion:
    """A reusable, reserved shared-memory segment."""

    def __init__(self) -> None:
        self._seg: _Segment | None = None

    @property
    def name(self) -> str:
        assert self._seg is not None
        return self._seg.name

    @property
    def size(self) -> int:
        return 0 if self._seg is None else self._seg.size

    def ensure(self, nbytes: int, prefault: bool = False, room: int = 0) -> memoryview:
        """Returns a writable view of at least `nbytes` (the same view while
        the segment is kept). Growing replaces the segment: the old one is
        unlinked and unmapped, and views of it stop working; it grows to
        `nbytes + room` where /dev/shm has that much free, so that slightly
        larger requests after it do not replace it again. With `prefault`,
        every page is touched once (so the first update writes at memcpy
        speed). Raises StagingSpaceError when /dev/shm cannot hold it."""
        if self._seg is None or self._seg.size < nbytes:
            self.close()
            size = max(nbytes, 1)
            if room > 0 and size + room <= shm_free_bytes():
                size += room
            self._seg = _Segment(size)
            log.info("staging region %s: %d bytes reserved", self._seg.name, self._seg.size)
        if prefault and not self._seg.touched:
            self._seg.prefault()
        return self._seg.view

    def close(self) -> None:
        seg, self._seg = self._seg, None
        if seg is not None:
            seg.close()


def remove_stale_segments() -> list[str]:
    """Unlinks the staging segments of servers that are gone (unlocked ones);
    leaves locked ones, and those of other users, alone."""
    removed = []
    for path in glob.glob(os.path.join(SHM_DIR, PREFIX + "*")):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            continue
        except OSError as e:  # PermissionError: another user's; ELOOP: a symlink
            log.debug("staging segment %s left alone: %s", path, e)
            continue
        try:
            if _is_stale(fd, path):
                os.unlink(path)
                removed.append(path)
        except FileNotFoundError:
            pass  # another server's cleaner was first
        except OSError as e:  # a cleanup problem never stops a start
            log.info("staging segment %s left alone: %s", path, e)
        finally:
            os.close(fd)
    if removed:
        log.info("removed %d stale staging segment(s): %s", len(removed), removed)
    return removed


def _is_stale(fd: int, path: str) -> bool:
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        log.info("staging segment %s left alone: owned by uid %d", path, st.st_uid)
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # its server is alive
    st = os.fstat(fd)
    if st.st_size == 0 and time.time() - st.st_mtime < _CREATING_SECONDS:
        return False  # being created (see _CREATING_SECONDS)
    # Still the file we locked, not one created under the name since.
    return os.stat(path, follow_symlinks=False).st_ino == st.st_ino


class SegmentReader:
    """A vLLM worker's read mapping of the server's staging segment.

    Opened through /dev/shm directly, never with
    multiprocessing.shared_memory: on Python < 3.13 attaching through the
    latter registers the segment with the worker's resource tracker, which
    unlinks the server's segment when the worker exits. Takes no lock: the
    lock is the server's sign of life.
    """

    def __init__(self) -> None:
        self._mm: mmap.mmap | None = None
        self._name: str | None = None

    def view(self, name: str, needed: int) -> mmap.mmap:
        """The mapping of segment `name`, at least `needed` bytes long. Reused
        while the name is the same and it is big enough; remapping closes the
        previous mapping."""
        mm = self._mm
        if mm is not None and name == self._name and len(mm) >= needed:
            return mm
        if not name.startswith(PREFIX) or "/" in name:
            raise ValueError(f"{name!r} is not a staging segment name")
        self.close()
        # Mapped writable only because torch.frombuffer warns on read-only
        # buffers; the worker never writes to it.
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_NOFOLLOW)
        try:
            size = os.fstat(fd).st_size
            if size < needed:
                raise ValueError(f"staging segment {name} has {size} bytes, {needed} needed")
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._name = name
        return self._mm

    def close(self) -> None:
        """Unmaps. Tensors still viewing the mapping keep it alive until they
        are freed (close() cannot unmap memory in use)."""
        mm, self._mm, self._name = self._mm, None, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # unmapped when the last tensor over it is freed


def _touch(buf: memoryview, step: int = 1 << 24) -> None:
    zeros = bytes(min(step, len(buf)))
    for start in range(0, len(buf), step):
        end = min(start + step, len(buf))
        buf[start:end] = zeros[: end - start]
