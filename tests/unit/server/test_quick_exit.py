"""An engine process spawned under the server ends without the
interpreter's final collection (rollout_service/engine/quick_exit.py): its
exit functions run and its exit code is kept, the collection does not run,
and a process spawned outside an armed server ends as Python ends it."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from rollout_service.engine import parent_watch
from tests.support import exits


def _spawn(folder, monkeypatch, armed: bool) -> int:
    if armed:  # as server.py arms it: the server's pid
        monkeypatch.setenv(parent_watch.ENV, str(os.getpid()))
    else:
        monkeypatch.delenv(parent_watch.ENV, raising=False)
    p = multiprocessing.get_context("spawn").Process(target=exits.child, args=(str(folder), 3))
    p.start()
    p.join(60)
    return p.exitcode


def test_an_armed_spawned_process_skips_the_final_collection(tmp_path, monkeypatch):
    assert _spawn(tmp_path, monkeypatch, armed=True) == 3
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "caught").read_text() == "7"
    assert not (tmp_path / "collected").exists()


def test_outside_an_armed_server_the_process_ends_as_python_ends_it(tmp_path, monkeypatch):
    assert _spawn(tmp_path, monkeypatch, armed=False) == 3
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "collected").read_text() == "collected"


@pytest.mark.parametrize("code", [None, "a message"])
def test_exit_codes_that_are_not_numbers(code, monkeypatch):
    from rollout_service.engine import quick_exit

    ended = []
    monkeypatch.setattr(quick_exit.os, "_exit", ended.append)
    monkeypatch.setattr(quick_exit.atexit, "_run_exitfuncs", lambda: None)
    quick_exit.end(code)
    assert ended == [0 if code is None else 1]
