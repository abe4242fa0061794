"""Engine configurations that would break the update promise are refused at
start, with a message saying why (no engine is started for them)."""

from __future__ import annotations

import json

import pytest

from rollout_service.engine.startup import _connector_resets_its_cache
from tests.support.serve_command import Run, serve_each

RUNS = {
    # ExampleConnector stores KV on disk and does not implement reset_cache:
    # KV computed under old weights would outlive an update.
    "example connector": Run(
        (
            "--kv-transfer-config",
            json.dumps({"kv_connector": "ExampleConnector", "kv_role": "kv_both"}),
        )
    ),
    "foreign worker extension": Run(("--worker-extension-cls", "somewhere.Else")),
}


@pytest.fixture(scope="module")
def refused():
    """Each run of RUNS to its end, vLLM imported once for all of them."""
    return serve_each(RUNS)


def test_a_kv_connector_that_cannot_reset_its_cache_is_refused(refused):
    p = refused["example connector"]
    assert p.returncode != 0
    assert "ExampleConnector" in p.stderr and "reset" in p.stderr, p.stderr[-2000:]
    assert "SERVING" not in p.stderr


def test_a_foreign_worker_extension_is_refused(refused):
    p = refused["foreign worker extension"]
    assert p.returncode != 0 and "worker-extension-cls" in p.stderr, p.stderr[-2000:]


def test_connectors_are_judged_by_their_reset_cache():
    assert _connector_resets_its_cache("OffloadingConnector")
    assert not _connector_resets_its_cache("ExampleConnector")
    assert not _connector_resets_its_cache("NoSuchConnector")
