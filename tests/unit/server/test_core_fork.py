"""The engine core starts from a copy of the server forked ahead
(rollout_service/engine/core_fork.py): the process vLLM starts is that copy,
with the environment the server has at the launch; what the copy cannot take
as a fresh interpreter would, it refuses, and the process is spawned as
before; a copy that is never launched goes away with the server."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest

from rollout_service.engine import core_fork


def _drive(mode: str, tmp_path) -> tuple[dict, dict, str]:
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.fork_ahead", mode, str(out)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), json.loads(out.read_text()), done.stderr


def test_the_process_vllm_starts_is_the_copy_forked_ahead(tmp_path):
    ran, seen, log = _drive("plain", tmp_path)
    assert seen["pid"] == ran["pid"] == ran["child"]
    assert seen["copied"], "a fresh interpreter ran it"
    assert seen["late"] == "0", "a variable set after the fork did not reach it"
    assert ran["exitcode"] == 5
    assert "spawned, not forked" not in log


def test_a_variable_the_copy_cannot_take_gets_the_process_spawned(tmp_path):
    ran, seen, log = _drive("other", tmp_path)
    assert not seen["copied"]
    assert seen["pid"] == ran["pid"] != ran["child"]
    assert seen["late"] == "0"
    assert ran["exitcode"] == 5
    assert "engine core spawned, not forked: it would differ in SOME_SETTING" in log


def test_arguments_that_pass_descriptors_get_the_process_spawned(tmp_path):
    ran, seen, log = _drive("descriptors", tmp_path)
    assert not seen["copied"]
    assert seen["conn"] == "through the pipe"
    assert ran["exitcode"] == 5
    assert "file descriptors in its arguments" in log


def test_a_ctrl_c_before_the_launch_is_the_servers(tmp_path):
    ran, seen, _ = _drive("ctrl-c", tmp_path)
    assert seen["copied"] and seen["pid"] == ran["child"]
    assert ran["exitcode"] == 5


def test_a_copy_never_launched_ends_with_the_server(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.fork_ahead", "away", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=180,
    )
    child = json.loads(done.stdout)["child"]
    deadline = time.monotonic() + 30
    while _running(child):
        assert time.monotonic() < deadline, f"the copy {child} outlived the server"
        time.sleep(0.1)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _mapped_library() -> str:
    with open("/proc/self/maps") as f:
        return next(line.split()[-1] for line in f if ".so" in line.split()[-1])


@pytest.mark.parametrize(
    ("changed", "refused"),
    [
        ({"VLLM_WORKER_MULTIPROC_METHOD": "spawn", "ROLLOUT_SERVICE_SERVER_PID": "1"}, []),
        ({"TORCHINDUCTOR_CPP_DYNAMIC_THREADS": "1"}, []),
        ({"AITER_SITUV2_A4W4": "1"}, []),
        ({"OMP_NUM_THREADS": "1"}, ["OMP_NUM_THREADS"]),
        ({"LD_PRELOAD": "/nowhere/libnothing.so"}, ["LD_PRELOAD"]),
    ],
)
def test_what_the_copy_takes_of_a_changed_environment(changed, refused):
    assert core_fork.unexplained({"PATH": "/bin"}, {"PATH": "/bin", **changed}) == refused


def test_a_variable_read_at_an_import_is_refused_once_that_module_is_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "numexpr", sys)
    assert core_fork.unexplained({}, {"NUMEXPR_MAX_THREADS": "2"}) == ["NUMEXPR_MAX_THREADS"]
    monkeypatch.delitem(sys.modules, "numexpr")
    assert core_fork.unexplained({}, {"NUMEXPR_MAX_THREADS": "2"}) == []


def test_a_preloaded_library_the_copy_has_mapped_is_taken():
    library = _mapped_library()
    assert core_fork.unexplained({}, {"LD_PRELOAD": library}) == []
    assert core_fork.unexplained({}, {"LD_PRELOAD": f"{library}:/nowhere/x.so"}) == ["LD_PRELOAD"]


def test_off_a_cpu_host_nothing_is_forked():
    assert not core_fork.fork_ahead(cpu_host=False)
    assert core_fork._ahead is None


def test_a_library_taken_out_of_ld_preload_is_refused():
    library = _mapped_library()
    assert core_fork.unexplained({"LD_PRELOAD": library}, {}) == ["LD_PRELOAD"]
    assert core_fork.unexplained({"LD_PRELOAD": library}, {"LD_PRELOAD": ""}) == ["LD_PRELOAD"]


_BUILD_THEN_FORK = """
import os, signal, sys
from pathlib import Path
import torch
from rollout_service.engine.tiny_models import ensure_model
if __name__ == "__main__":
    torch.set_num_threads(2)
    ensure_model("tiny-qwen2", Path(sys.argv[1]))
    pid = os.fork()
    if pid == 0:
        signal.alarm(30)  # a child waiting on OpenMP threads that are gone dies here
        x = torch.randn(1000, 1000)
        (x @ x).sum()
        torch.empty(4_000_000).normal_()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_fork_after_the_embedded_models_build_still_runs_parallel_kernels(tmp_path):
    """The build runs torch's parallel kernels; run in the server, their
    OpenMP threads would be missing in the engine core forked after it, and
    its workers would wait on them for good (tiny_models._build_apart)."""
    done = subprocess.run(
        [sys.executable, "-c", _BUILD_THEN_FORK, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "tiny-qwen2-v1" / "config.json").is_file()
