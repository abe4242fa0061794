"""The C++ client's build for tests/clients/test_cpp_client.py: done by
`scripts/setup --dev` (`python -m tests.support.cpp_build`), as npm ci and the
verl venv are, so that a fresh clone's test run does not compile (about 60
CPU-s); when the tests are collected it runs again in the background at the
lowest CPU priority (with nothing changed, make has nothing to do; after a
change to client/cpp it takes what the tests leave idle), and the module's
`trainer` fixture waits for it.

The tests' build is a folder of its own (build/ is ignored), so that it never
reuses or reconfigures a user's client/cpp/build (whose cache keeps the
CMAKE_BUILD_TYPE it was configured with), and compiled at -Og rather than
Release's -O3: about half the CPU time of a clean build on 2 cores, and still
the flow analysis -Wall -Wextra need for -Wmaybe-uninitialized (-O0 has none).
What the tests check does not depend on the level: the program's bytes come
from integer arithmetic, memcpy and exact IEEE conversions, and -DNDEBUG as
in Release. "None": an empty CMAKE_BUILD_TYPE would become Release
(client/cpp/CMakeLists.txt) and append -O3 to these flags.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CPP_DIR = REPO / "client" / "cpp"
BUILD_DIR = REPO / "build" / "cpp-tests"
BUILD_FLAGS = ["-DCMAKE_BUILD_TYPE=None", "-DCMAKE_CXX_FLAGS=-Og -DNDEBUG"]
BINARY = BUILD_DIR / "rollout_trainer"
TOOLS = ("cmake", "make", "c++", "protoc", "grpc_cpp_plugin")
MODULE = "tests/clients/test_cpp_client.py"

_lock = threading.Lock()
_thread: threading.Thread | None = None
_outcome: list[str] = []  # what failed, if anything did


def missing_tools() -> list[str]:
    return [t for t in TOOLS if not shutil.which(t)]


def start() -> None:
    """Starts the build in a thread, once (nothing if a tool is missing:
    `built` says so)."""
    global _thread
    with _lock:
        if _thread is None and not missing_tools():
            _thread = threading.Thread(target=_build, name="cpp-build", daemon=True)
            _thread.start()


def built(timeout: float = 1200) -> Path:
    """The built program, once the build has ended; AssertionError with the
    failed step's output otherwise."""
    start()
    assert _thread is not None
    _thread.join(timeout)
    assert not _thread.is_alive(), f"the C++ build ran over {timeout:.0f} s"
    assert not _outcome, _outcome[0]
    assert os.access(BINARY, os.X_OK), BINARY
    return BINARY


def _build() -> None:
    cache = BUILD_DIR / "CMakeCache.txt"
    if cache.exists() and f"CMAKE_HOME_DIRECTORY:INTERNAL={CPP_DIR}\n" not in cache.read_text():
        shutil.rmtree(BUILD_DIR)  # configured for a copy of the repository elsewhere
    steps = [
        (["cmake", "-S", str(CPP_DIR), "-B", str(BUILD_DIR), *BUILD_FLAGS], 300),
        (["cmake", "--build", str(BUILD_DIR), "-j2"], 900),
    ]
    for cmd, timeout in steps:
        try:
            # Lowest priority through nice(1), not a preexec_fn: that makes
            # subprocess fork this process (not vfork), which runs gRPC's fork
            # handlers while tests call gRPC from other threads: the child
            # aborted in them once ("Check failed: next_worker->state == KICKED").
            p = subprocess.run(
                ["nice", "-n", "19", *cmd], capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            _outcome.append(f"`{' '.join(cmd)}` ran over {timeout} s")
            return
        if p.returncode != 0:
            _outcome.append(
                f"`{' '.join(cmd)}` exited {p.returncode}\n"
                f"--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-4000:]}"
            )
            return


if __name__ == "__main__":
    if missing := missing_tools():
        raise SystemExit(f"the C++ client's build needs {', '.join(missing)}")
    _build()
    if _outcome:
        raise SystemExit(_outcome[0])
    print(f"built {BINARY.relative_to(REPO)}")
