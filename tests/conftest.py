"""Shared fixtures: the session's real-engine servers (the default one, a
secure one, a float32 one with LoRA on, a fresh one on test_delta's last
step, one with the HTTP front and tokens), the servers a module has to
itself, the packed Node client, and the check after each module that it
left every shared server as it found it.

How each server starts is declared here; when it starts (the shared ones as
soon as the tests are collected, a module's own while the module before it
runs), which tests are marked `engine` and the suite's order (tests that
need no engine first) are the plugin tests.support.orchestration's.

Helpers that are not fixtures live in tests/support/; no test module imports
another test module or this file (tests/repo/test_layout.py).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.certs import make_certs, python_tls, server_tls_args
from harness.serverproc import LoggedServer, ServerProcess
from rollout_client import RolloutClient
from rollout_service.worker.weights_backend import FAULT_FILE_ENV
from tests.support import (
    idle_ahead,
    lora,
    serve_forks,
    server_starts,
    sessions,
    shared_servers,
    weights_reference,
)
from tests.support.fp32_model import build_fp32_tiny_qwen2
from tests.support.http_front import http_flags
from tests.support.node import Packed, packed_once
from tests.support.otlp_collector import start_collector
from tests.support.think_model import build_think_model
from tests.support.tokens import ADMIN, GENERATE, GENERATE_B
from tests.support.tp2 import start_tp2_servers
from tests.support.watched_load import run_watched

pytest_plugins = ["tests.support.orchestration", "tests.support.companion"]

# Every server the suite starts holds a 64 MiB KV cache, not the default
# 1 GiB: the suite runs up to a dozen servers at once on 24 GiB, and the
# embedded models' longest test needs a few MB (131,072 tokens of tiny-qwen2
# fit). At 256 MiB a server was 1.6 GB resident, and a rehearsal's kernel
# killed a worker for memory (-9) while servers started ahead.
KV_CACHE_BYTES = 64 << 20
ServerProcess.default_args = ("--kv-cache-memory-bytes", str(KV_CACHE_BYTES))
# Forked from one process that imported the command once (a start's vLLM
# import is about half its CPU): tests/support/serve_forks.py.
ServerProcess.launch = staticmethod(serve_forks.launch)

# The session's files (certificates, the fault file, the float32 checkpoint),
# made before any fixture runs: the shared servers start at collection.
_TMP = Path(tempfile.mkdtemp(prefix="rollout-tests-"))
# What the servers leave behind goes there too: their logs and vLLM's IPC
# sockets, which a killed server (many tests kill one) leaves in /tmp
# otherwise (a run left about 30 logs and 250 sockets there). Removed after
# the run, unless it failed: then it keeps the logs (pytest_terminal_summary).
LoggedServer.log_dir = str(_TMP)
os.environ["VLLM_RPC_BASE_PATH"] = str(_TMP)
_failed: list[int] = []


@atexit.register
def _remove_tmp() -> None:
    if not _failed:
        shutil.rmtree(_TMP, ignore_errors=True)


def pytest_terminal_summary(terminalreporter, exitstatus):
    if exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        _failed.append(exitstatus)
        terminalreporter.write_line(f"the servers' logs of this run: {_TMP}")


FAULT_FILE = _TMP / "fail-next-load"
# A staging segment of a process that does not exist (tests/engine/serving/test_hardening.py).
STALE_SEGMENT = Path("/dev/shm/rollout-staging-999999999-1")


@pytest.fixture(scope="session")
def fault_file():
    """While this file exists, the session server's engine fails to load
    weights (see weights_backend.FAULT_FILE_ENV)."""
    return FAULT_FILE


def _with_http(*args: str, env: dict[str, str] | None = None) -> ServerProcess:
    """A server on the default flags and `args`, with the HTTP front on (its `http_target`)."""
    return ServerProcess(*args, "--http-port", "0", env=env)


def _start_server():
    # The HTTP front on too: the load test's OpenAI agent; metrics for the
    # dashboard's Prometheus (tests/engine/serving/test_dashboard.py).
    return _with_http("--metrics-port", "0", env={FAULT_FILE_ENV: str(FAULT_FILE)}), None


def _start_secure():
    tmp = _TMP / "secure"
    tmp.mkdir()
    certs = make_certs(tmp)
    tokens = tmp / "tokens"
    tokens.write_text(f"admin:{ADMIN}\ngenerate:{GENERATE}\ngenerate:{GENERATE_B}\n")
    # Fair share's flags: tests/engine/serving/test_fair_share.py floods exactly the cap.
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


def _start_own():
    # The HTTP front on too: the docs' OpenAI snippets run against it (test_snippets).
    return _with_http()


def _start_http_front():
    # tests/engine/openai/test_http_front.py's: its last test stops the server under a
    # running stream (a grace for it); its cap test holds two streams a caller.
    folder = _TMP / "http-front"
    folder.mkdir(exist_ok=True)
    flags = ("--tool-call-parser", "hermes", "--grace-seconds", "60")
    return ServerProcess(*http_flags(folder, *flags, "--max-requests-per-caller", "2"))


def _start_http_sessions():
    folder = _TMP / "http-sessions"
    folder.mkdir(exist_ok=True)
    return ServerProcess(*http_flags(folder))


def _start_hardened():
    # tests/engine/serving/test_hardening.py's: tokens, mutual TLS, small limits, metrics and
    # JSON logs on one server, which must remove at start a staging segment
    # a crashed run left (written before it starts).
    folder = _TMP / "hardened"
    folder.mkdir()
    certs = make_certs(folder)
    tokens = folder / "tokens"
    tokens.write_text("# role:token\ngenerate:gen-token\nadmin:admin-token\n")
    STALE_SEGMENT.write_bytes(b"left over by a crashed run")
    proc = ServerProcess(
        "--tokens-file", str(tokens),
        *server_tls_args(certs),
        "--max-prompt-tokens", "64",
        "--max-queued-generate", "3",
        "--metrics-port", "0",
        "--log-json",
    )  # fmt: skip
    proc.tls = python_tls(certs)  # type: ignore[attr-defined]
    proc.ready_options = proc.tls  # type: ignore[attr-defined]
    proc.stale_segment = STALE_SEGMENT  # type: ignore[attr-defined]
    return proc


def _start_traced():
    # tests/engine/serving/test_observability.py's: spans exported to a collector in this
    # process every 200 ms (instead of every 5 s: the tests wait less), metrics.
    collector, receiver, otlp_port = start_collector()
    proc = ServerProcess(
        "--otlp-traces-endpoint", f"http://127.0.0.1:{otlp_port}",
        "--metrics-port", "0",
        env={"OTEL_BSP_SCHEDULE_DELAY": "200"},
    )  # fmt: skip
    proc.collector, proc.receiver = collector, receiver  # type: ignore[attr-defined]
    return proc


def _start_first_run():
    # tests/engine/serving/test_startup_messages.py's: as on a first run, the
    # embedded model not built yet (its cache folder empty); a grace no test
    # waits for (the module's second Ctrl-C has to end it).
    cache = _TMP / "first-run-models"
    cache.mkdir()
    proc = ServerProcess("--grace-seconds", "600", env={"ROLLOUT_SERVICE_CACHE": str(cache)})
    proc.model_cache = cache  # type: ignore[attr-defined]
    return proc


def _start_reasoning():
    # tests/engine/openai/test_reasoning.py's: a model that thinks on a chain
    # (tests/support/think_model.py), vLLM's deepseek_r1 and hermes parsers.
    model = build_think_model(_TMP / "tiny-think")
    parsers = ("--reasoning-parser", "deepseek_r1", "--tool-call-parser", "hermes")
    proc = _with_http("--model", str(model), *parsers)
    proc.model = model  # type: ignore[attr-defined]
    return proc


# How each server fixture's process starts (tests.support.server_starts
# says when). The shared servers (session fixtures): the process, and what
# else its fixture needs.
_SHARED_SERVERS = {
    "server": _start_server,
    "shared_secure": _start_secure,
    "fp32_server": _start_fp32,
    "delta_reference": _start_delta_reference,
    "http_sessions_server": lambda: (_start_http_sessions(), None),
}
# Servers one module has to itself (it kills, stops or restarts them, or no
# other module runs its flags), by module-scoped fixture: a process, or
# several by name. The fixture waits until it is ready and stops it after
# its module.
_OWN_SERVERS = {
    "own_server": _start_own,
    # A second replica beside own_server (tests/engine/openai/test_fleet_urls.py).
    "second_own_server": _start_own,
    # Fresh for its first update; its metrics read by tests/engine/weights/test_keep_switch.py.
    "keep_server": lambda: ServerProcess("--metrics-port", "0"),
    "draining_server": lambda: ServerProcess("--grace-seconds", "30"),
    "llava_server": lambda: _with_http("--model", "tiny-llava"),
    "tp2_servers": start_tp2_servers,
    "sessions_server": lambda: ServerProcess(*sessions.server_args(_TMP / "sessions")),
    # The HTTP front with tokens and metrics (tests/support/http_front.py):
    # test_http_front's flags.
    "http_front_server": _start_http_front,
    "hardened_server": _start_hardened,
    "traced_server": _start_traced,
    "reasoning_server": _start_reasoning,
    "first_run_server": _start_first_run,
    "weights_reference_server": lambda: weights_reference.start_server(_TMP / "weights-new"),
    "promise_reference_server": lambda: weights_reference.start_promise_server(
        _TMP / "weights-promise"
    ),
}
server_starts.declare(shared=_SHARED_SERVERS, own=_OWN_SERVERS)


@pytest.fixture(scope="session")
def server(fault_file):
    """The embedded tiny-qwen2 model on a real vLLM engine, shared by every
    module on the default flags: each module finds it on its original weights
    and must leave it as `_left_clean` checks."""
    proc, _ = server_starts.started("server")
    idle_ahead.wait_for("server")  # its engine may be stopped until then
    with shared_servers.serving("session server", proc, fault_file=fault_file):
        yield proc


@pytest.fixture(scope="module")
def own_server():
    """A server on the default flags that this module has to itself (to kill,
    restart or stop)."""
    with server_starts.own("own_server") as proc:
        yield proc


@pytest.fixture(scope="module")
def second_own_server():
    """A second server of this module's own, as own_server (--http-port)."""
    with server_starts.own("second_own_server") as proc:
        yield proc


@pytest.fixture(scope="module")
def keep_server():
    """A server of this module's own, fresh (its first update is the
    module's), with its metrics on (its `metrics_port`)."""
    with server_starts.own("keep_server") as proc:
        yield proc


@pytest.fixture(scope="module")
def weights_reference_server():
    """A fresh engine on the new weights test_weights.py pushes, with a tiny
    update-size limit (tests/support/weights_reference.py)."""
    with server_starts.own("weights_reference_server") as proc:
        yield proc


@pytest.fixture(scope="module")
def promise_reference_server():
    """A fresh engine on the weights test_update_promise.py pushes: full, then
    partial (tests/support/weights_reference.py)."""
    with server_starts.own("promise_reference_server") as proc:
        yield proc


@pytest.fixture(scope="module")
def draining_server():
    """A server of this module's own with 30 s of grace at shutdown."""
    with server_starts.own("draining_server") as proc:
        yield proc


@pytest.fixture(scope="module")
def llava_server():
    """The embedded tiny LLaVA (images in) on a server of this module's own."""
    with server_starts.own("llava_server") as proc:
        yield proc


@pytest.fixture(scope="module")
def sessions_server():
    """A server of this module's own for sessions: tokens, small session
    bounds and a chat template that drops earlier reasoning
    (tests/support/sessions.py)."""
    with server_starts.own("sessions_server") as proc:
        yield proc


@pytest.fixture(scope="module")
def http_front_server():
    """tests/engine/openai/test_http_front.py's server: the HTTP front, tokens, metrics,
    the hermes tool parser, two generations a caller, 60 s of grace."""
    with server_starts.own("http_front_server") as proc:
        yield proc


@pytest.fixture(scope="session")
def http_sessions_server():
    """The HTTP front with tokens and metrics, shared like `server` by the
    modules that open sessions through it (tests/engine/openai/test_http_sessions.py,
    test_openai_agent.py, tests/clients/test_node_openai.py)."""
    proc, _ = server_starts.started("http_sessions_server")
    with shared_servers.serving("HTTP sessions server", proc, {"token": ADMIN}):
        yield proc


@pytest.fixture(scope="module")
def hardened_server():
    """tests/engine/serving/test_hardening.py's server (its `tls` client options and
    `metrics_port`, and the `stale_segment` it removed at start)."""
    try:
        with server_starts.own("hardened_server") as proc:
            yield proc
    finally:
        STALE_SEGMENT.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def traced_server():
    """tests/engine/serving/test_observability.py's server: its spans go to its `collector`
    (tests/support/otlp_collector.py), its `metrics_port`."""
    with server_starts.own("traced_server") as proc:
        try:
            yield proc
        finally:
            proc.receiver.stop(0)


@pytest.fixture(scope="module")
def reasoning_server():
    """A model that thinks (tests/support/think_model.py) served with
    --reasoning-parser deepseek_r1 and --tool-call-parser hermes, the HTTP
    front on (`http_target`), its checkpoint's folder `model`."""
    with server_starts.own("reasoning_server") as proc:
        yield proc


@pytest.fixture(scope="module")
def first_run_server():
    """tests/engine/serving/test_startup_messages.py's server, started as on a
    first run: its `model_cache` was empty until it built the embedded model;
    600 s of grace."""
    with server_starts.own("first_run_server") as proc:
        yield proc


@pytest.fixture(scope="module")
def tp2_servers():
    """A TP=2 server per layout of tests/support/tp2.py, by layout name."""
    with server_starts.own("tp2_servers") as procs:
        yield procs


@pytest.fixture(scope="session")
def delta_reference():
    """A fresh engine on the last step of tests/support/delta_steps.py's
    simulated training (tests/engine/weights/test_delta.py), with a quarter of GenerateMany's
    default stream budget (test_generate_many's waiting reader)."""
    proc, _ = server_starts.started("delta_reference")
    idle_ahead.wait_for("delta_reference")  # test_keepalive's idle minute
    with shared_servers.serving("delta reference server", proc):
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
    proc, certs = server_starts.started("shared_secure")
    tls = python_tls(certs)
    with shared_servers.serving("secure server", proc, {"token": ADMIN, **tls}):
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
    proc, model = server_starts.started("fp32_server")
    with shared_servers.serving("float32 server", proc):
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
def packed() -> Packed:
    """client/node packed and installed into an empty folder (tests/support/node.py),
    for the Node client's tests and the keepalive test."""
    return packed_once()


@pytest.fixture(autouse=True, scope="module")
def _left_clean(request):
    """After each module, each shared server running: not degraded, not
    asleep, running no request and holding no staged update the module left
    behind, or the module fails here, loudly, instead of a later module
    failing for a reason of this one's. Weights the module pushed and left
    are put back (the checkpoint it started on, under its first version) and
    checked: every module starts on the same weights, whatever ran before."""
    yield
    if left := shared_servers.left_behind(request.module.__name__):
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


@pytest.fixture(scope="session")
def watched_load(server, tmp_path_factory):
    """One short Locust run on the session server while a Prometheus scrapes
    it and a caller makes refused calls (tests/support/watched_load.py):
    test_load_locust checks the run's report, test_dashboard its metrics."""
    with run_watched(server, tmp_path_factory.mktemp("watched-load")) as run:
        yield run
