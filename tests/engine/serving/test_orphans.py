"""A server killed outright leaves no vLLM process behind.

SIGKILL gives the server no chance to shut its engine down: its engine core
and workers must notice on their own (parent_watch.py) and end within seconds,
instead of living on as orphans holding gigabytes.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from rollout_service.engine import parent_watch
from rollout_service.handoff.region import remove_stale_segments

# Engine core: SIGTERM at once, os._exit at the latest parent_watch's grace
# later; its workers the same after it. Well under this on an idle machine.
DEADLINE_SECONDS = 15


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


# vLLM forks its engine processes by default and spawns them in some setups
# (CUDA initialised, for one); the watcher reaches them by different paths.
# A real server here covers both: its engine core is spawned (vLLM's CPU
# platform sets VLLM_WORKER_MULTIPROC_METHOD=spawn while it builds the
# config) and forks its worker (rollout_service.engine.worker_fork). The stand-in
# parent below covers each path alone
# (test_a_child_ends_at_once_when_its_parent_is_killed).


def test_sigkilled_server_leaves_no_engine_processes(own_server):
    proc = own_server
    descendants: list[psutil.Process] = []
    try:
        descendants = psutil.Process(proc.proc.pid).children(recursive=True)
        names = [p.name() for p in descendants]
        assert any("EngineCore" in n for n in names), names
        assert any("Worker" in n for n in names), names
        proc.proc.send_signal(signal.SIGKILL)
        proc.proc.wait()
        t0 = time.monotonic()
        while _alive(descendants) and time.monotonic() - t0 < DEADLINE_SECONDS:
            time.sleep(0.2)
        left = [(p.pid, p.name()) for p in _alive(descendants)]
        took = time.monotonic() - t0
        print(f"descendants gone after {took:.1f}s; left: {left}")
        assert not left, f"still alive {took:.0f}s after the server was killed: {left}"
    finally:
        proc.stop()
        for p in _alive(descendants):
            p.kill()
        remove_stale_segments()  # the killed server's, which a next start would remove


# A stand-in for the server: arms (or not) and starts one child the way vLLM
# does, then waits to be killed.
MIDDLE = textwrap.dedent(
    """
    import multiprocessing, signal, sys, time
    from rollout_service.engine import parent_watch

    def child(ignore_sigterm):
        parent_watch.start_in_spawned_child()  # what the plugin hook does
        if ignore_sigterm:  # a main thread that never runs the handler
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(600)

    if __name__ == "__main__":
        method, arm, ignore = sys.argv[1], sys.argv[2] == "arm", sys.argv[3] == "ignore"
        if arm:
            parent_watch.arm()
        p = multiprocessing.get_context(method).Process(target=child, args=(ignore,))
        p.start()
        print(p.pid, flush=True)
        time.sleep(600)
    """
)


def _orphan_lifetime(tmp_path, method: str, arm: bool, ignore: bool, wait: float) -> float | None:
    """Seconds the middle's child lives after the middle is SIGKILLed, None
    if still alive after `wait` (it is killed then)."""
    script = tmp_path / "middle.py"
    script.write_text(MIDDLE)
    middle = subprocess.Popen(
        [sys.executable, str(script), method, "arm" if arm else "-", "ignore" if ignore else "-"],
        stdout=subprocess.PIPE,
        text=True,
    )
    child = psutil.Process(int(middle.stdout.readline()))
    try:
        time.sleep(0.5)  # the child's watcher is running
        middle.kill()
        middle.wait()
        t0 = time.monotonic()
        while _alive([child]) and time.monotonic() - t0 < wait:
            time.sleep(0.05)
        return None if _alive([child]) else time.monotonic() - t0
    finally:
        for p in _alive([child]):
            p.kill()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_child_ends_at_once_when_its_parent_is_killed(tmp_path, method):
    took = _orphan_lifetime(tmp_path, method, arm=True, ignore=False, wait=5)
    assert took is not None and took < 2, took


def test_a_child_that_ignores_sigterm_exits_after_the_grace(tmp_path):
    took = _orphan_lifetime(
        tmp_path, "fork", arm=True, ignore=True, wait=parent_watch.GRACE_SECONDS + 5
    )
    assert took is not None and parent_watch.GRACE_SECONDS - 1 < took, took


def test_without_arm_children_are_left_alone(tmp_path):
    # Other programs loading this package as a vLLM plugin keep vLLM's behaviour.
    assert _orphan_lifetime(tmp_path, "spawn", arm=False, ignore=False, wait=2) is None
