"""The client's modules that moved keep their old import paths for a
deprecation period: to rollout_codecs (the codecs the server and the client
share), and into the client's packages by concern (calls/, weights/,
fleet/). Importing an old path warns, names the new path, and gives the very
module the new path gives (so isinstance checks and module state agree)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CODECS = ["wire", "delta", "delta_kernels", "dtypes", "sources", "extras"]
CALLS = ["connection", "core", "generate_request", "versions"]
WEIGHTS = [
    "interrupts",
    "manifest",
    "update_options",
    "push",
    "push_async",
    "delta_push",
    "delta_costs",
]
FLEET = ["health", "replicas", "sessions", "staging"]
# (old name under rollout_client, new module path)
MOVED = (
    [(name, f"rollout_codecs.{name}") for name in CODECS]
    + [(name, f"rollout_client.calls.{name}") for name in CALLS]
    + [(name, f"rollout_client.weights.{name}") for name in WEIGHTS]
    + [(f"fleet_{name}", f"rollout_client.fleet.{name}") for name in FLEET]
)

CHECK = """
import importlib, json, sys, warnings
name, new_path = sys.argv[1], sys.argv[2]
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    old = importlib.import_module(f"rollout_client.{name}")
new = importlib.import_module(new_path)
from_import = getattr(__import__("rollout_client", fromlist=[name]), name)
print(json.dumps({
    "same": old is new and from_import is new,
    "warnings": [(w.category.__name__, str(w.message)) for w in seen],
}))
"""


def moved(old: str, new: str) -> dict:
    # A fresh interpreter: a module imports (and warns) once per process.
    out = subprocess.run(
        [sys.executable, "-c", CHECK, old, new], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


@pytest.mark.parametrize(("name", "new"), MOVED)
def test_an_old_path_warns_and_gives_the_moved_module(name, new):
    seen = moved(name, new)
    assert seen["same"]
    assert [w for w in seen["warnings"] if w[0] == "DeprecationWarning" and new in w[1]], seen[
        "warnings"
    ]


MOVED_OUT_OF_CORE = [
    "prepare_update",
    "send_update",
    "retry_delay",
    "adapter_target",
    "adapter_removal",
]

CHECK_CORE = """
import json, sys, warnings
from rollout_client.calls import core
from rollout_client.weights import updates
name = sys.argv[1]
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    old = getattr(core, name)
print(json.dumps({
    "same": old is getattr(updates, name),
    "warnings": [(w.category.__name__, str(w.message)) for w in seen],
}))
"""


@pytest.mark.parametrize("name", MOVED_OUT_OF_CORE)
def test_an_update_function_moved_out_of_core_warns_and_is_the_same(name):
    out = subprocess.run(
        [sys.executable, "-c", CHECK_CORE, name], capture_output=True, text=True, check=True
    )
    seen = json.loads(out.stdout)
    assert seen["same"]
    assert [
        w
        for w in seen["warnings"]
        if w[0] == "DeprecationWarning" and "rollout_client.weights.updates" in w[1]
    ], seen["warnings"]


def test_the_packages_that_took_a_module_name_need_no_alias():
    """rollout_client.fleet is now a package whose __init__ holds what the
    old flat module held: its old path imports without a warning."""
    out = subprocess.run(
        [
            sys.executable,
            "-W",
            "error::DeprecationWarning",
            "-c",
            "from rollout_client.fleet import Fleet, FleetUpdateError, resolve",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
