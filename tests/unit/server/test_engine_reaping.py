"""vLLM's engine-core monitor thread and its shutdown both ask whether the
engine core has ended (rollout_service/engine/vllm_compat.serialize_reaping):
driven here with vLLM's own two functions on real child processes standing
in for engine cores, no engine. Unserialized, a stop now and then found a
process that had exited "alive" and vLLM force-killed it: a suite's test of
Ctrl-C during start-up failed on vLLM's "force killing" log line, and this
test's 60 stops without the lock force-killed 7."""

from __future__ import annotations

import dataclasses
import inspect
import multiprocessing
import os
import signal
import threading
import time
from types import SimpleNamespace

from vllm.v1 import utils as vllm_utils
from vllm.v1.engine.utils import CoreEngineProcManager

from rollout_service.engine import vllm_compat

STOPS = 60


def _engine_core() -> None:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    time.sleep(60)


def _stop(proc) -> None:
    """vLLM's sequence: its monitor waits on the process's sentinel in a
    thread; the shutdown marks the manager stopped, then terminates and joins
    the process and kills it if it still looks alive."""
    manager = SimpleNamespace(
        processes=[proc],
        manager_stopped=threading.Event(),
        failed_proc_name=None,
        shutdown=lambda: None,
    )
    engine = SimpleNamespace(
        engine_core=SimpleNamespace(resources=SimpleNamespace(engine_manager=manager))
    )
    vllm_compat.serialize_reaping(engine)
    monitor = threading.Thread(
        target=CoreEngineProcManager.monitor_engine_liveness, args=(manager,)
    )
    monitor.start()
    time.sleep(0.02)  # the monitor waits on the sentinel, as it does all along in a server
    manager.manager_stopped.set()
    vllm_utils.shutdown([proc], timeout=30)
    monitor.join(10)


def test_a_stopped_engine_core_that_exited_is_never_force_killed(monkeypatch):
    killed: list[int] = []
    monkeypatch.setattr(vllm_utils, "kill_process_tree", killed.append)
    ctx = multiprocessing.get_context("fork")
    for _ in range(STOPS):
        proc = ctx.Process(target=_engine_core, daemon=True)
        proc.start()
        time.sleep(0.01)
        _stop(proc)
        assert proc.exitcode == 0
    assert killed == [], f"force-killed {len(killed)} of {STOPS} engine cores that had exited"


def test_an_engine_without_engine_processes_is_left_alone():
    vllm_compat.serialize_reaping(SimpleNamespace(engine_core=SimpleNamespace()))
    vllm_compat.serialize_reaping(SimpleNamespace())


def test_the_engine_processes_are_where_the_lock_looks_for_them():
    # Read from the installed vLLM: an upgrade that moves them fails here,
    # not silently in a server's stop.
    from vllm.v1.engine.core_client import BackgroundResources, MPClient

    assert "engine_manager" in {f.name for f in dataclasses.fields(BackgroundResources)}
    assert "self.resources = BackgroundResources(" in inspect.getsource(MPClient.__init__)
    assert "self.processes.append(" in inspect.getsource(CoreEngineProcManager.__init__)
