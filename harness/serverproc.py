"""Runs a server subprocess for tests and benchmarks: `rollout-service serve`
(ServerProcess), or any other server a benchmark measures it against
(LoggedServer, whose one lifecycle both share)."""

from __future__ import annotations

import atexit
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rollout_client import RolloutClient

# Tests run with Dynamo off: otherwise every new engine spends 45-65 s
# compiling vLLM's logprobs gather on its first request (see the CPU notes).
# AOT compile must be off with it, or the worker refuses to start.
TEST_ENGINE_ENV = {"TORCHDYNAMO_DISABLE": "1", "VLLM_USE_AOT_COMPILE": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hold_port(port: int = 0) -> socket.socket | None:
    """A socket bound, not listening, to `port` (0: a free one) with
    SO_REUSEADDR and SO_REUSEPORT, as gRPC binds: while it is open no other
    process gets that port, not even for an outgoing connection, and a
    server binding it as gRPC does still can. None if the port is taken."""
    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        held.bind(("127.0.0.1", port))
    except OSError:
        held.close()
        return None
    return held


class LoggedServer:
    """A server subprocess with its log in a temporary file: started with
    TEST_ENGINE_ENV over the caller's environment, waited for until
    `ready()`, stopped with SIGTERM (killed past a deadline). Subclasses give
    the command and `ready()`."""

    name = "server"
    # How the process starts: subprocess.Popen, called as below. A test suite
    # may start its servers another way (tests/support/serve_forks.py).
    launch: Callable[..., Any] = staticmethod(subprocess.Popen)
    # Seconds between readiness checks; 0 for a check that itself waits.
    poll_seconds = 1.0
    # The folder of the logs: the system's temporary folder, unless a test
    # suite keeps them in its own.
    log_dir: str | None = None

    def __init__(
        self, cmd: list[str], env: dict[str, str] | None = None, log_prefix: str = "server-"
    ) -> None:
        self.log = Path(tempfile.mkstemp(prefix=log_prefix, suffix=".log", dir=self.log_dir)[1])
        full_env = {**os.environ, **TEST_ENGINE_ENV, **(env or {})}
        self._log_file = open(self.log, "wb")
        self.proc = self.launch(cmd, stdout=self._log_file, stderr=subprocess.STDOUT, env=full_env)

    def ready(self) -> bool:
        raise NotImplementedError

    def wait_ready(self, timeout: float = 300) -> None:
        self._wait_until(self.ready, timeout)

    def _wait_until(
        self, ready: Callable[[], bool], timeout: float, every: float | None = None
    ) -> None:
        """Until `ready()`, asked every `every` seconds (`poll_seconds`);
        fails with the log's tail if the server exits or the timeout passes."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")
            if ready():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready:\n{self.tail()}")
            time.sleep(self.poll_seconds if every is None else every)

    def tail(self, n: int = 60) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def stop(self, timeout: float = 60, wait: bool = True) -> int | None:
        """SIGTERM, then its exit status; `wait=False` returns at once and
        leaves the wait (vLLM's shutdown takes about 5 s) to `reap_stopped`,
        so a test session does not spend it once per server."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            if not wait:
                _stopping.append((self, time.monotonic() + timeout))
                return None
        return self._finish(timeout)

    def kill(self) -> None:
        """What a server still running past its stop's deadline gets."""
        self.proc.kill()

    def _finish(self, timeout: float) -> int:
        try:
            self.proc.wait(max(timeout, 0))
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()
        self._log_file.close()
        return self.proc.returncode


class ServerProcess(LoggedServer):
    """`rollout-service serve` as a subprocess, ready when its health is SERVING.

    Its gRPC port (`port`, or a free one) is held (`hold_port`) until the
    server has bound it: a port chosen here and bound seconds later could be
    taken in between (another test's outgoing connections use the same
    range: a server of CI's once exited "127.0.0.1:53899 is in use"). The
    HTTP front and /metrics bind port 0 where its flags say so; `http_port`
    and `metrics_port` read what the log says was bound."""

    # Each check waits up to 2 s on the health service itself.
    poll_seconds = 0.0
    # Flags every server gets before its own (a test suite sets a smaller
    # KV cache here: tests/conftest.py).
    default_args: tuple[str, ...] = ()

    def __init__(
        self, *args: str, env: dict[str, str] | None = None, port: int | None = None
    ) -> None:
        # An explicit port: a restart at the same address (session ids name it).
        self._held = hold_port(port or 0)
        self.port: int = self._held.getsockname()[1] if self._held else int(port or 0)
        self.target = f"127.0.0.1:{self.port}"
        self._bound: dict[str, int] = {}
        cmd = [
            str(Path(sys.executable).with_name("rollout-service")),
            "serve",
            "--port",
            str(self.port),
            "--grace-seconds",
            "5",
            *self.default_args,
            *args,
        ]
        super().__init__(cmd, env=env, log_prefix="rollout-server-")

    @property
    def http_port(self) -> int:
        """The HTTP front's port (for a server started with --http-port)."""
        return self._logged("http_port")

    @property
    def http_target(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def metrics_port(self) -> int:
        """The /metrics port (for a server started with --metrics-port)."""
        return self._logged("metrics_port")

    def _logged(self, name: str, timeout: float = 300) -> int:
        """The port the server's log says it bound as `name`; waits for the
        line, and fails with the log's tail if the server exits first."""
        if name not in self._bound:
            found = _BOUND_LINES[name]

            def named() -> bool:
                m = found.search(self.log.read_text(errors="replace"))
                if m:
                    self._bound[name] = int(m.group(1))
                return m is not None

            self._wait_until(named, timeout, every=0.1)
        return self._bound[name]

    def wait_ready(self, timeout: float = 300, **client_options) -> None:
        """Until health is SERVING (`client_options`: a token, TLS files for
        RolloutClient); fails with the log's tail if the server exits."""
        with RolloutClient(self.target, **client_options) as client:

            def serving() -> bool:
                try:
                    client.wait_until_ready(timeout=2)
                    return True
                except TimeoutError:
                    return False

            self._wait_until(serving, timeout)
        self.release_port()

    def release_port(self) -> None:
        """Lets go of the held port (the server has bound it, or stops)."""
        if self._held is not None:
            self._held.close()
            self._held = None

    def stop(self, timeout: float = 60, wait: bool = True) -> int | None:
        self.release_port()
        return super().stop(timeout, wait)


# The lines of rollout_service/server.py that name a port it bound.
_BOUND_LINES = {
    "http_port": re.compile(r"OpenAI-compatible API on \S+:(\d+) "),
    "metrics_port": re.compile(r"metrics on http://\S+:(\d+)/metrics"),
}

# Servers told to stop that may still be shutting down, with their deadlines.
_stopping: list[tuple[LoggedServer, float]] = []


@atexit.register
def reap_stopped() -> None:
    """Waits for every server stopped with `wait=False` (killed past its
    deadline): none outlives the session."""
    while _stopping:
        proc, deadline = _stopping.pop()
        proc._finish(deadline - time.monotonic())


@contextmanager
def running(*args: str, env: dict[str, str] | None = None) -> Iterator[ServerProcess]:
    """A server started, ready, and stopped at the end (for fixtures; the
    stop is not waited for, see ServerProcess.stop)."""
    proc = ServerProcess(*args, env=env)
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop(wait=False)
