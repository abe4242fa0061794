"""Shared fixtures: one real-engine server per test session."""

from __future__ import annotations

import pytest

from rollout_client import RolloutClient
from rollout_service.weights_backend import FAULT_FILE_ENV
from tests.serverproc import ServerProcess


@pytest.fixture(scope="session")
def fault_file(tmp_path_factory):
    """While this file exists, the session server's engine fails to load
    weights (see weights_backend.FAULT_FILE_ENV)."""
    return tmp_path_factory.mktemp("fault") / "fail-next-load"


@pytest.fixture(scope="session")
def server(fault_file):
    """The embedded tiny-qwen2 model on a real vLLM engine."""
    proc = ServerProcess(env={FAULT_FILE_ENV: str(fault_file)})
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def client(server):
    with RolloutClient(server.target, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def info(client):
    return client.server_info()
