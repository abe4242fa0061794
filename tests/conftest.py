"""Shared fixtures (the session's real-engine servers: the default one, a
secure one, a float32 one with LoRA on, a fresh one on test_delta's last
step; the packed Node client), and the
suite's order: tests that need no engine run first, so a broken converter
fails in seconds, not after the engine tests; `-m "not engine"`
(`scripts/test --fast`) runs only those.

A test needs an engine when it uses a server fixture of this file (directly
or through another fixture), or its module starts servers of its own (imports
harness.serverproc's ServerProcess or running). It is marked `engine` here, so
the marker cannot go stale.

Helpers that are not fixtures live in tests/support/; no test module imports
another test module or this file (tests/test_layout.py).
"""

from __future__ import annotations

import atexit
import logging
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.certs import make_certs, python_tls, server_tls_args
from harness.serverproc import ServerProcess
from rollout_client import RolloutClient
from rollout_service.worker.weights_backend import FAULT_FILE_ENV
from tests.support import lora, sessions
from tests.support.fp32_model import build_fp32_tiny_qwen2
from tests.support.node import Packed, pack_and_install
from tests.support.served_weights import (
    Fingerprint,
    fingerprint,
    restore,
    served_checkpoint,
    update_left_open,
)
from tests.support.tokens import ADMIN, GENERATE, GENERATE_B
from tests.support.tp2 import start_tp2_servers

log = logging.getLogger(__name__)


# The session's files (certificates, the fault file, the float32 checkpoint),
# made before any fixture runs: the shared servers start at collection.
_TMP = Path(tempfile.mkdtemp(prefix="rollout-tests-"))
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)
FAULT_FILE = _TMP / "fail-next-load"


@pytest.fixture(scope="session")
def fault_file():
    """While this file exists, the session server's engine fails to load
    weights (see weights_backend.FAULT_FILE_ENV)."""
    return FAULT_FILE


def _start_server():
    return ServerProcess(env={FAULT_FILE_ENV: str(FAULT_FILE)}), None


def _start_secure():
    tmp = _TMP / "secure"
    tmp.mkdir()
    certs = make_certs(tmp)
    tokens = tmp / "tokens"
    tokens.write_text(f"admin:{ADMIN}\ngenerate:{GENERATE}\ngenerate:{GENERATE_B}\n")
    # Fair share's flags: tests/test_fair_share.py floods exactly the cap.
    fair = ("--max-requests-per-caller", "600", "--caller-shares", "admin=2")
    return ServerProcess("--tokens-file", str(tokens), *fair, *server_tls_args(certs)), certs


def _start_fp32():
    # LoRA's flags (tests/support/lora.py) are float32 and processed logprobs
    # too: one engine serves the float32 trainers and the LoRA tests.
    model = build_fp32_tiny_qwen2(_TMP / "tiny-qwen2-f32")
    return ServerProcess("--model", str(model), *lora.SERVER_FLAGS), model


def _start_delta_reference():
    from tests.support.delta_steps import last_step_checkpoint

    # A quarter of GenerateMany's default stream budget: test_generate_many's
    # waiting reader fills four budgets here in a fifth of the time.
    return ServerProcess(
        "--model",
        str(last_step_checkpoint(_TMP / "delta-last-step")),
        "--max-stream-tokens",
        str(1 << 18),
    ), None


# Each shared server's fixture and how it starts: (the process, what else
# its fixture needs). All that the collected
# tests use start at once, as soon as they are collected (pytest_collection_finish):
# a start is ~20 s of mostly single-threaded imports, which then overlap each
# other and the engine-free tests that run first.
_STARTERS = {
    "server": _start_server,
    "shared_secure": _start_secure,
    "fp32_server": _start_fp32,
    "delta_reference": _start_delta_reference,
}
_early: dict = {}


def _started(fixture: str):
    """The server started early for `fixture`, or one started now."""
    return _early.pop(fixture, None) or _STARTERS[fixture]()


# Servers one module has to itself (it kills, stops or restarts them, or no
# other module runs its flags), by module-scoped fixture. Each starts while
# the module before it runs, so its start-up (about 20 s, mostly imports on
# one core) overlaps that module's tests; the fixture waits until it is
# ready and stops it after its module.
_AHEAD_STARTERS = {
    "own_server": lambda: ServerProcess(),
    "draining_server": lambda: ServerProcess("--grace-seconds", "30"),
    "llava_server": lambda: ServerProcess("--model", "tiny-llava"),
    "tp2_servers": start_tp2_servers,
    "sessions_server": lambda: ServerProcess(*sessions.server_args(_TMP / "sessions")),
}
# Per module, in run order, the ones it uses; and what has been started for
# each module (by index), in the order the modules will take them.
_ahead_uses: list[tuple[str, list[str]]] = []
_ahead_started: set[int] = set()
_ahead: dict[str, list] = {}


def _start_ahead(index: int) -> None:
    if index < len(_ahead_uses) and index not in _ahead_started:
        _ahead_started.add(index)
        for fixture in _ahead_uses[index][1]:
            _ahead.setdefault(fixture, []).append(_AHEAD_STARTERS[fixture]())


def _processes(started) -> list[ServerProcess]:
    return list(started.values()) if isinstance(started, dict) else [started]


@contextmanager
def _own(fixture: str):
    """What was started ahead for `fixture` (the next module's in run order),
    or started now; ready, and stopped after the block."""
    queue = _ahead.get(fixture)
    started = queue.pop(0) if queue else _AHEAD_STARTERS[fixture]()
    try:
        for proc in _processes(started):
            proc.wait_ready()
        yield started
    finally:
        for proc in _processes(started):
            proc.stop(wait=False)


def pytest_collection_finish(session):
    used = set()
    for item in session.items:
        used.update(getattr(item, "fixturenames", ()))
    for fixture in _STARTERS.keys() & used:
        _early[fixture] = _STARTERS[fixture]()
    for item in session.items:
        module = item.nodeid.split("::")[0]
        if not _ahead_uses or _ahead_uses[-1][0] != module:
            _ahead_uses.append((module, []))
        uses = _ahead_uses[-1][1]
        uses.extend(f for f in _AHEAD_STARTERS if f in item.fixturenames and f not in uses)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before a module's first test: its own servers, if not yet started,
    and those of the next module that has any (they start while this one
    runs)."""
    module = item.nodeid.split("::")[0]
    for index, (name, _) in enumerate(_ahead_uses):
        if name == module:
            _start_ahead(index)
            later = (i for i in range(index + 1, len(_ahead_uses)) if _ahead_uses[i][1])
            _start_ahead(next(later, len(_ahead_uses)))
            break


def pytest_sessionfinish(session):
    for proc, _ in _early.values():  # never used (a run stopped early)
        proc.stop(wait=False)
    for queue in _ahead.values():
        for started in queue:
            for proc in _processes(started):
                proc.stop(wait=False)


@dataclass
class Shared:
    """A server every module may use, as it was when it became ready: what a
    module must leave it as (`_left_clean`)."""

    name: str
    proc: ServerProcess
    client_options: dict  # RolloutClient's: a token, TLS files
    start: Fingerprint = field(init=False)
    checkpoint: Path = field(init=False)
    fault_file: Path | None = None

    def __post_init__(self) -> None:
        with self.client() as c:
            self.start = fingerprint(c)
            self.checkpoint = served_checkpoint(c)

    def client(self, **kw) -> RolloutClient:
        return RolloutClient(self.proc.target, **{"timeout": 120, **self.client_options, **kw})


_shared: list[Shared] = []  # the shared servers started so far, while they run


@contextmanager
def _serving(name: str, proc: ServerProcess, client_options=None, fault_file=None):
    """`proc` once ready, shared (checked and restored by `_left_clean`)
    while the block runs, stopped after it."""
    options = client_options or {}
    shared = None
    try:
        proc.wait_ready(**options)
        shared = Shared(name, proc, options, fault_file=fault_file)
        _shared.append(shared)
        yield
    finally:
        if shared in _shared:
            _shared.remove(shared)
        proc.stop(wait=False)


@pytest.fixture(scope="session")
def server(fault_file):
    """The embedded tiny-qwen2 model on a real vLLM engine, shared by every
    module on the default flags: each module finds it on its original weights
    and must leave it as `_left_clean` checks."""
    proc, _ = _started("server")
    with _serving("session server", proc, fault_file=fault_file):
        yield proc


@pytest.fixture(scope="module")
def own_server():
    """A server on the default flags that this module has to itself (to kill,
    restart or stop)."""
    with _own("own_server") as proc:
        yield proc


@pytest.fixture(scope="module")
def draining_server():
    """A server of this module's own with 30 s of grace at shutdown."""
    with _own("draining_server") as proc:
        yield proc


@pytest.fixture(scope="module")
def llava_server():
    """The embedded tiny LLaVA (images in) on a server of this module's own."""
    with _own("llava_server") as proc:
        yield proc


@pytest.fixture(scope="module")
def sessions_server():
    """A server of this module's own for sessions: tokens, small session
    bounds and a chat template that drops earlier reasoning
    (tests/support/sessions.py)."""
    with _own("sessions_server") as proc:
        yield proc


@pytest.fixture(scope="module")
def tp2_servers():
    """A TP=2 server per layout of tests/support/tp2.py, by layout name."""
    with _own("tp2_servers") as procs:
        yield procs


@pytest.fixture(scope="session")
def delta_reference():
    """A fresh engine on the last step of tests/support/delta_steps.py's
    simulated training (tests/test_delta.py), with a quarter of GenerateMany's
    default stream budget (test_generate_many's waiting reader)."""
    proc, _ = _started("delta_reference")
    with _serving("delta reference server", proc):
        yield proc


@dataclass(frozen=True)
class Secure:
    """A server with bearer tokens and mutual TLS: the process, the
    certificate files, and RolloutClient's TLS arguments for them."""

    proc: ServerProcess
    certs: dict[str, Path]
    tls: dict


@pytest.fixture(scope="session")
def shared_secure():
    """One tokens-and-mutual-TLS server for every module that needs one on
    these flags (the C++ and Node clients, the role table); tokens in
    tests/support/tokens.py."""
    proc, certs = _started("shared_secure")
    tls = python_tls(certs)
    with _serving("secure server", proc, {"token": ADMIN, **tls}):
        yield Secure(proc, certs, tls)


@dataclass(frozen=True)
class Fp32Server:
    """The float32 server: the process, its address and the float32
    checkpoint it serves (a trainer loads the same one)."""

    proc: ServerProcess
    target: str
    model: Path


@pytest.fixture(scope="session")
def fp32_server():
    """A float32 copy of tiny-qwen2 (tests/support/fp32_model.py) served in
    float32 with processed logprobs (after temperature, what a trainer
    scores): for the training-inference mismatch at float32 precision; with
    LoRA on (`lora_server`). Shared like `server`: each module finds it on its
    original weights."""
    proc, model = _started("fp32_server")
    with _serving("float32 server", proc):
        yield Fp32Server(proc, proc.target, model)


@pytest.fixture
def lora_server(fp32_server) -> ServerProcess:
    """The float32 server: LoRA is on there, with the other engine options of
    tests/support/lora.py's SERVER_FLAGS, for test_engine_options and
    test_bad_inputs' adapter cases. The test that stops it runs last
    (marked `last`)."""
    return fp32_server.proc


@pytest.fixture
def lora_client(lora_server):
    with RolloutClient(lora_server.target, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def packed(tmp_path_factory) -> Packed:
    """client/node packed and installed into an empty folder (tests/support/node.py),
    for the Node client's tests and the keepalive test."""
    return pack_and_install(
        tmp_path_factory.mktemp("node-pack"), tmp_path_factory.mktemp("node-app")
    )


_restored: list[tuple[str, str]] = []  # (module, server) whose weights were put back


def _problems(shared: Shared, module: str) -> list[str]:
    """What a module left wrong on `shared`; its weights restored if they
    were all that was wrong."""
    with shared.client(timeout=30, retries=0) as c:
        deadline = time.monotonic() + 15
        while (info := c.server_info()).engine_requests and time.monotonic() < deadline:
            time.sleep(0.1)
        fault_file = shared.fault_file
        problems = [
            what
            for what, bad in (
                ("degraded (an update failed inside the engine)", info.degraded),
                ("asleep", info.sleeping),
                (f"{info.engine_requests} engine requests still running", info.engine_requests),
                (
                    "its fault file in place (the next update would fail)",
                    fault_file is not None and fault_file.exists(),
                ),
            )
            if bad
        ]
        if problems:
            return problems
        if (why := update_left_open(c)) is not None:
            return [f"holding a staged update open (a new one is refused: {why})"]
        now = fingerprint(c)
    if now.matches(shared.start):
        return []
    log.info("restoring the %s's weights: %s (started on %s)", shared.name, now, shared.start)
    try:
        with shared.client(timeout=120) as c:
            restore(c, shared.start, shared.checkpoint)
            now = fingerprint(c)
    except Exception as e:  # whatever it is, this module's report says it
        return [f"on other weights ({now}); restoring {shared.checkpoint} failed: {e!r}"]
    _restored.append((module, shared.name))
    if not now.matches(shared.start):
        return [f"on other weights, not its own after a restore: {now}, not {shared.start}"]
    return []


@pytest.fixture(autouse=True, scope="module")
def _left_clean(request):
    """After each module, each shared server running: not degraded, not
    asleep, running no request and holding no staged update the module left
    behind, or the module fails here, loudly, instead of a later module
    failing for a reason of this one's. Weights the module pushed and left
    are put back (the checkpoint it started on, under its first version) and
    checked: every module starts on the same weights, whatever ran before."""
    yield
    left = []
    for shared in list(_shared):
        if shared.proc.proc.poll() is None and (
            problems := _problems(shared, request.module.__name__)
        ):
            left.append(f"the {shared.name} " + "; ".join(problems))
    if left:
        pytest.fail("this module left " + ", and ".join(left), pytrace=False)


@pytest.fixture(scope="session")
def client(server):
    with RolloutClient(server.target, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def info(client):
    """The session server's info as this module first asks for it (each
    module starts on the same weights and version: `_left_clean`)."""
    return client.server_info()


_STARTS_SERVERS = ("ServerProcess", "running")
# This file's fixtures that start servers; the others start none.
_SERVER_FIXTURES = set(_STARTERS) | set(_AHEAD_STARTERS)


def _starts_servers(module) -> bool:
    return any(
        getattr(getattr(module, name, None), "__module__", None) == "harness.serverproc"
        for name in _STARTS_SERVERS
    )


def _needs_engine(item) -> bool:
    """The item uses a server fixture of this file, or its module, or the
    module of any fixture it uses, starts servers."""
    if _SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    modules = {getattr(item, "module", None)}
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        # This file's fixtures start servers only through _SERVER_FIXTURES.
        modules.update(
            sys.modules.get(d.func.__module__) for d in defs if d.func.__module__ != __name__
        )
    return any(_starts_servers(m) for m in modules if m is not None)


def pytest_terminal_summary(terminalreporter):
    """Which modules left other weights on a shared server (put back by
    `_left_clean`): each costs a full update, and none may count on another's."""
    if _restored:
        lines = [f"{module} (the {name})" for module, name in _restored]
        terminalreporter.write_line("weights restored after: " + ", ".join(lines))


def pytest_collection_modifyitems(config, items):
    engine = pytest.mark.engine
    for item in items:
        if _needs_engine(item):
            item.add_marker(engine)
    # Stable: within each group, the files' and tests' own order; a test that
    # stops a shared server after all that may use it.
    items.sort(
        key=lambda item: (
            item.get_closest_marker("engine") is not None,
            item.get_closest_marker("last") is not None,
        )
    )
