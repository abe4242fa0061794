"""Shared fixtures: one real-engine server per test session."""

from __future__ import annotations

import pytest

from rollout_client import RolloutClient
from tests.serverproc import ServerProcess


@pytest.fixture(scope="session")
def server():
    """The embedded tiny-qwen2 model on a real vLLM engine."""
    proc = ServerProcess()
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
