"""What a new user sees from `rollout-service serve`, start to end: a bad
--model or a busy port answered in one paragraph that says what to do, before
any engine starts; the phases of start-up logged in order up to SERVING;
no vLLM warning that means nothing here; and a Ctrl-C, during start-up or
after, that ends the server without tracebacks or "leaked" lines.

A terminal's Ctrl-C sends SIGINT to every process of its foreground group:
the server and, under it, vLLM's engine core, its worker and the resource
tracker. `ctrl_c` does the same to the server's process tree."""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import psutil
import pytest

from harness.serverproc import ServerProcess
from harness.weights_util import random_weights, version
from rollout_client import RolloutClient
from rollout_service import cli
from rollout_service.ops import logs
from rollout_service.worker import plugins

SERVE = str(Path(sys.executable).with_name("rollout-service"))
LAYERWISE = "vllm.model_executor.model_loader.reload.layerwise"


def serve(*args: str) -> subprocess.CompletedProcess:
    """`rollout-service serve` run to its end (a refusal: no engine starts)."""
    return subprocess.run([SERVE, "serve", *args], capture_output=True, text=True, timeout=120)


def ctrl_c(server: ServerProcess) -> list[psutil.Process]:
    """SIGINT to the server and every process under it, as a terminal's
    Ctrl-C reaches its foreground process group; returns them all."""
    root = psutil.Process(server.proc.pid)
    tree = [root, *root.children(recursive=True)]
    for p in tree:
        try:
            p.send_signal(signal.SIGINT)
        except psutil.NoSuchProcess:
            pass
    return tree


def ended_cleanly(server: ServerProcess, tree: list[psutil.Process]) -> str:
    """Waits for the server and every process it started, those it starts
    meanwhile included (the resource tracker writes its warnings last);
    returns the log, which must hold no traceback, no "leaked" line and no
    process vLLM had to kill."""
    seen = {p.pid: p for p in tree}
    deadline = time.monotonic() + 300
    while server.proc.poll() is None:
        assert time.monotonic() < deadline, server.tail()
        try:
            seen.update((c.pid, c) for c in psutil.Process(server.proc.pid).children(True))
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.2)
    assert server.proc.returncode == 0, server.tail()
    _, alive = psutil.wait_procs(list(seen.values()), timeout=60)
    assert not alive, f"left behind: {alive}"
    log = server.log.read_text(errors="replace")
    for bad in ("Traceback", "leaked", "force killing", "SIGKILL"):
        assert bad not in log, f"{bad!r} in the log:\n{server.tail(80)}"
    return log


def wait_for(server: ServerProcess, ready, what: str) -> None:
    """Until `ready()`; fails with the log's tail if the server exits first."""
    deadline = time.monotonic() + 300
    while not ready():
        assert server.proc.poll() is None, server.tail()
        assert time.monotonic() < deadline, f"no {what}:\n{server.tail()}"
        time.sleep(0.1)


def engine_core_started(server: ServerProcess) -> bool:
    """Whether vLLM's engine core, a child of the server, runs (forked ahead
    and launched: it took vLLM's title)."""
    try:
        children = psutil.Process(server.proc.pid).children()
        return any(" ".join(c.cmdline()).startswith("VLLM::EngineCore") for c in children)
    except psutil.Error:
        return False


def in_order(log: str, *lines: str) -> list[int]:
    """Where each of `lines` first shows in `log`, asserting they come in
    this order."""
    at = []
    for line in lines:
        assert line in log, f"no {line!r} in the log"
        at.append(log.index(line))
    assert at == sorted(at), list(zip(lines, at))
    return at


@pytest.mark.parametrize(
    ("model", "said"),
    [
        ("{tmp}/no-such-checkpoint", "there is no file or folder at {tmp}/no-such-checkpoint"),
        ("tiny-qwen", "(did you mean tiny-qwen2?)"),
        ("{tmp}", "{tmp} is a folder without a config.json"),
    ],
)
def test_a_bad_model_is_one_paragraph_naming_the_path_and_the_embedded_models(
    tmp_path, model, said
):
    p = serve("--port", "0", "--model", model.format(tmp=tmp_path))
    assert p.returncode == 2, p.stderr  # argparse's status for a usage error
    ours = [line for line in p.stderr.splitlines() if line.startswith("rollout-service:")]
    assert len(ours) == 1, p.stderr
    assert said.format(tmp=tmp_path) in ours[0]
    assert "tiny-qwen2 (served when --model is not given) or tiny-llava" in ours[0]
    assert "Traceback" not in p.stderr and "Repo id" not in p.stderr
    assert "listening on" not in p.stderr and "EngineCore" not in p.stderr, "nothing started"
    assert "vllm" not in p.stderr, "refused before vLLM's import (10 to 15 s)"


def test_help_says_which_model_is_the_default(monkeypatch, capsys):
    # In this process (vLLM is imported already): `serve --help` as main runs it.
    monkeypatch.setattr(logs, "configure", lambda json_lines: None)  # pytest's handlers stay
    with pytest.raises(SystemExit) as ended:
        cli._serve(["serve", "--help"])
    assert ended.value.code == 0
    out = capsys.readouterr().out
    assert "tiny-qwen2 (served when --model is not given) or tiny-llava" in out
    assert "tiny-llava (the default)" not in out


def test_a_busy_port_is_refused_naming_the_port_and_what_to_do():
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        p = serve("--port", str(port))
    assert p.returncode == 1, p.stderr
    assert f"cannot start: 127.0.0.1:{port} is in use" in p.stderr
    assert f"--port {port + 1}" in p.stderr and "--port 0" in p.stderr
    assert "Traceback" not in p.stderr and "listening on" not in p.stderr
    assert "vllm" not in p.stderr, "refused before vLLM's import (10 to 15 s)"


def test_the_rotary_warning_is_dropped_and_the_loggers_other_lines_kept(caplog):
    plugins.quiet_noise()
    vllm_log = logging.getLogger(LAYERWISE)
    with caplog.at_level(logging.WARNING):
        vllm_log.warning("%s: Failed to load weights", "RotaryEmbedding")
        vllm_log.warning("%s: Failed to load weights", "QKVParallelLinear")
    assert [r.getMessage() for r in caplog.records] == ["QKVParallelLinear: Failed to load weights"]


@pytest.fixture(scope="module")
def first_run(first_run_server):
    """A server started as on a first run (tests/conftest.py; started while the
    modules before this one run), and the model cache it built into."""
    return first_run_server, first_run_server.model_cache


def test_start_up_says_each_phase_in_order_up_to_serving(first_run):
    server, cache = first_run
    in_order(
        server.log.read_text(errors="replace"),
        f"building the embedded model tiny-qwen2 into {cache}/tiny-qwen2-v1 (first run only)",
        f"listening on 127.0.0.1:{server.port}",
        "starting the engine (vLLM): usually",
        "engine up in",
        "warming up: usually",
        f"SERVING tiny-qwen2 on 127.0.0.1:{server.port}",
    )


def test_a_full_weight_update_logs_no_rotary_embedding_warning(first_run):
    server, _ = first_run
    with RolloutClient(server.target, timeout=120) as client:
        info = client.server_info()
        v = version()
        client.update_weights(random_weights(info.parameters, seed=7), version=v)
        assert client.server_info().weight_version == v
    # Logged by vLLM's worker after every update (worker/plugins.py).
    assert "RotaryEmbedding: Failed to load weights" not in server.log.read_text(errors="replace")


def test_ctrl_c_twice_ends_the_grace_then_the_server_and_engine_without_leaks(first_run):
    """The first Ctrl-C gives the calls in flight their grace (600 s here),
    the second ends them; the engine is shut down in order either way."""
    server, _ = first_run
    with RolloutClient(server.target, timeout=600, retries=0) as client:
        with ThreadPoolExecutor(4) as pool:
            # 128,000 tokens to generate: seconds of work on any machine.
            calls = [
                pool.submit(
                    client.generate, prompt_text="hello", max_tokens=2000, n=16, ignore_eos=True
                )
                for _ in range(4)
            ]
            wait_for(server, lambda: client.server_info().engine_requests, "calls in flight")
            tree = ctrl_c(server)
            wait_for(server, lambda: "shutting down" in server.tail(), "the shutdown")
            tree += ctrl_c(server)
            log = ended_cleanly(server, tree)
        assert all(call.exception() is not None for call in calls), "a call was not ended"
        # Ended UNAVAILABLE, which a retry policy retries elsewhere (gRPC's
        # stop without grace cancelled them: CANCELLED, retried by none).
        codes = {call.exception().code for call in calls}  # type: ignore[union-attr]
        assert codes == {grpc.StatusCode.UNAVAILABLE}, codes
    in_order(
        log,
        "shutting down: NOT_SERVING, 600.0s grace for in-flight calls (a second signal ends it)",
        "second signal: in-flight calls are ended now",
        "shutdown complete",
    )


def test_ctrl_c_during_start_up_stops_once_the_engine_is_up():
    server = ServerProcess()
    try:
        # While the engine core starts: it died of it in its imports before.
        wait_for(server, lambda: engine_core_started(server), "engine core")
        log = ended_cleanly(server, ctrl_c(server))
        in_order(log, "signal received during start-up", "shutdown complete")
        assert "SERVING tiny-qwen2" not in log
    finally:
        server.stop()
