"""The staging region on a shared host: random names, liveness by lock, other
users' segments left alone, capacity reserved up front with a clear error on
a small /dev/shm, no mapping left behind, and the worker's reader."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.serverproc import TEST_ENGINE_ENV, free_port
from rollout_service.handoff import region as staging
from rollout_service.handoff.region import (
    PREFIX,
    SegmentReader,
    StagingRegion,
    remove_stale_segments,
)

NOBODY = 65534


@pytest.fixture
def region():
    r = StagingRegion()
    yield r
    r.close()


def _mapped(name: str) -> bool:
    return name in Path("/proc/self/maps").read_text()


def _leftover(tmp_name: str) -> Path:
    return Path(staging.SHM_DIR) / f"{PREFIX}{tmp_name}"


def test_names_are_random_and_the_file_is_private_and_reserved(region):
    other = StagingRegion()
    try:
        region.ensure(1 << 20)
        other.ensure(1 << 20)
        for name in (region.name, other.name):
            assert name.startswith(PREFIX) and len(name) == len(PREFIX) + 16
            assert str(os.getpid()) not in name
        assert region.name != other.name
        st = os.stat(f"/dev/shm/{region.name}")
        assert st.st_mode & 0o777 == 0o600
        # Reserved: the pages are allocated now, not at first write (a sparse
        # file would have no blocks).
        assert st.st_blocks * 512 >= 1 << 20
    finally:
        other.close()


def test_a_live_owners_segment_is_kept_and_a_dead_owners_removed():
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from rollout_service.handoff.region import StagingRegion\n"
            "r = StagingRegion(); r.ensure(4096); print(r.name, flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        path = Path("/dev/shm") / child.stdout.readline().strip()
        assert path.exists()
        assert str(path) not in remove_stale_segments()
        assert path.exists()
        child.send_signal(signal.SIGKILL)  # no cleanup of its own
        child.wait()
        assert path.exists()
        assert str(path) in remove_stale_segments()
        assert not path.exists()
    finally:
        child.kill()
        child.wait()


def test_this_processes_own_segment_is_kept(region):
    region.ensure(4096)
    remove_stale_segments()
    assert Path(f"/dev/shm/{region.name}").exists()


def test_another_users_segment_is_left_alone(caplog):
    path = _leftover("someone-elses")
    path.write_bytes(b"x" * 100)
    os.chown(path, NOBODY, NOBODY)
    try:
        with caplog.at_level("INFO", logger="rollout_service.handoff.region"):
            assert str(path) not in remove_stale_segments()
        assert path.exists()
        assert f"owned by uid {NOBODY}" in caplog.text
    finally:
        path.unlink()


def test_a_segment_that_cannot_be_opened_is_skipped(monkeypatch):
    path = _leftover("unreadable")
    path.write_bytes(b"x" * 100)
    real_open = os.open

    def open_(p, *args, **kwargs):
        if str(p) == str(path):
            raise PermissionError(13, "Permission denied", str(p))
        return real_open(p, *args, **kwargs)

    monkeypatch.setattr(staging.os, "open", open_)
    try:
        assert str(path) not in remove_stale_segments()
        assert path.exists()
    finally:
        monkeypatch.undo()
        path.unlink()


def test_an_empty_segment_is_left_while_it_may_be_being_created():
    path = _leftover("being-created")
    path.touch()
    try:
        assert str(path) not in remove_stale_segments()
        old = time.time() - 3600
        os.utime(path, (old, old))
        assert str(path) in remove_stale_segments()
    finally:
        path.unlink(missing_ok=True)


def test_a_symlink_is_not_followed(tmp_path):
    target = tmp_path / "precious"
    target.write_bytes(b"keep me")
    link = _leftover("symlink")
    link.symlink_to(target)
    try:
        remove_stale_segments()
        assert link.is_symlink() and target.read_bytes() == b"keep me"
    finally:
        link.unlink()


def test_growing_unlinks_and_unmaps_the_old_segment(region):
    view = region.ensure(4096, prefault=True)
    view[:5] = b"hello"
    old = region.name
    assert _mapped(old)
    region.ensure(1 << 20)
    assert region.name != old and region.size == 1 << 20
    assert not Path(f"/dev/shm/{old}").exists()
    assert not _mapped(old)
    with pytest.raises(ValueError, match="released"):  # the old view was released, not dangling
        view[0]


def test_growing_with_room_keeps_the_segment_for_slightly_larger_requests(region, monkeypatch):
    region.ensure(4096)
    region.ensure(1 << 20, room=1 << 18)
    grown = region.name
    assert region.size == (1 << 20) + (1 << 18)
    region.ensure((1 << 20) + 4096, room=1 << 18)
    assert region.name == grown, "fits in the room: not replaced"
    # Without that much free in /dev/shm, it grows to what was asked only.
    monkeypatch.setattr("rollout_service.handoff.region.shm_free_bytes", lambda: 3 << 20)
    region.ensure(2 << 20, room=2 << 20)
    assert region.size == 2 << 20


def test_a_slice_still_held_keeps_the_old_mapping_until_it_goes(region):
    piece = region.ensure(4096)[:16]
    old = region.name
    region.ensure(1 << 20)
    assert not Path(f"/dev/shm/{old}").exists()
    assert _mapped(old)  # still readable through the slice, never freed under it
    piece[0] = 1
    del piece
    assert not _mapped(old)


def test_a_forked_child_holds_neither_the_lock_nor_the_mapping(region):
    region.ensure(4096)
    name = region.name
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if nothing of the segment is left
        held = any(
            os.readlink(f"/proc/self/fd/{fd}").endswith(name)
            for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")
        )
        os._exit(1 if held or _mapped(name) else 0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _mapped(name)
    assert Path(f"/dev/shm/{name}").exists() and not remove_stale_segments()


def test_reader_maps_reuses_and_remaps(region):
    region.ensure(4096)[:5] = b"hello"
    reader = SegmentReader()
    try:
        first = reader.view(region.name, 4096)
        assert first[:5] == b"hello"
        assert reader.view(region.name, 100) is first
        region.ensure(1 << 20)[:5] = b"world"
        second = reader.view(region.name, 1 << 20)
        assert second[:5] == b"world" and first.closed
        with pytest.raises(ValueError, match="needed"):
            reader.view(region.name, (1 << 20) + 1)
        with pytest.raises(ValueError):  # noqa: PT011 (any refusal; the name is never opened)
            reader.view("../etc/passwd", 1)
    finally:
        reader.close()
    assert Path(f"/dev/shm/{region.name}").exists()  # the reader never unlinks


def _unshare_works() -> str | None:
    if shutil.which("unshare") is None:
        return "no unshare command"
    r = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
        capture_output=True,
        text=True,
    )
    return None if r.returncode == 0 else f"cannot mount a private /dev/shm: {r.stderr.strip()}"


def _in_small_shm(size: str, *cmd: str, **kwargs) -> subprocess.CompletedProcess:
    """Runs `cmd` in a private mount namespace whose /dev/shm is a `size` tmpfs."""
    reason = _unshare_works()
    if reason:
        pytest.skip(reason)
    script = f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$@"'
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", *cmd],
        capture_output=True,
        text=True,
        **kwargs,
    )


@pytest.mark.parametrize("where", ["free-space check", "fallocate"])
def test_reservation_fails_clearly_on_a_small_dev_shm(where):
    # The second case hides the free space from the check, so posix_fallocate
    # itself must refuse (as when another process takes the space meanwhile).
    code = textwrap.dedent(
        f"""
        import os
        from rollout_service.handoff import region as staging
        if {where == "fallocate"}:
            staging.shm_free_bytes = lambda: 1 << 40
        try:
            staging.StagingRegion().ensure(4 << 20)
        except staging.StagingSpaceError as e:
            print("ERROR", e)
        print("LEFT", os.listdir("/dev/shm"))
        """
    )
    r = _in_small_shm("1m", sys.executable, "-c", code, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "ERROR the staging region for weight updates needs 4.0 MiB in /dev/shm" in r.stdout
    assert "LEFT []" in r.stdout  # nothing half-made is left behind


def test_server_on_a_small_dev_shm_exits_at_once_with_the_remedy():
    exe = str(Path(sys.executable).with_name("rollout-service"))
    t0 = time.monotonic()
    # The embedded model's staging region (about 0.8 MiB) does not fit in 512 KiB.
    r = _in_small_shm(
        "512k",
        exe,
        "serve",
        "--port",
        str(free_port()),
        timeout=180,
        env={**os.environ, **TEST_ENGINE_ENV},
    )
    took = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 1, (r.returncode, out[-3000:])  # -7 would be SIGBUS
    assert "cannot start: the staging region for weight updates needs" in out
    for remedy in ("/dev/shm", "--shm-size", "medium: Memory", "sizeLimit", "--max-update-bytes"):
        assert remedy in out
    assert "EngineCore" not in out, "it should fail before the engine starts"
    print(f"exited {r.returncode} after {took:.1f}s")
