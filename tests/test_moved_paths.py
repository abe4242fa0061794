"""The client's modules that moved to rollout_codecs (the codecs the server
and the client share) keep their old import paths for a deprecation period:
importing one warns, names the new path, and gives the very module the new
path gives (so isinstance checks and module state agree)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

MOVED = ["wire", "delta", "delta_kernels", "dtypes", "sources", "extras"]

CHECK = """
import importlib, json, sys, warnings
name = sys.argv[1]
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    old = importlib.import_module(f"rollout_client.{name}")
new = importlib.import_module(f"rollout_codecs.{name}")
from_import = getattr(__import__("rollout_client", fromlist=[name]), name)
print(json.dumps({
    "same": old is new and from_import is new,
    "warnings": [(w.category.__name__, str(w.message)) for w in seen],
}))
"""


@pytest.mark.parametrize("name", MOVED)
def test_an_old_path_warns_and_gives_the_moved_module(name):
    # A fresh interpreter: a module imports (and warns) once per process.
    out = subprocess.run(
        [sys.executable, "-c", CHECK, name], capture_output=True, text=True, check=True
    )
    seen = json.loads(out.stdout)
    assert seen["same"]
    assert [
        w
        for w in seen["warnings"]
        if w[0] == "DeprecationWarning" and f"rollout_codecs.{name}" in w[1]
    ], seen["warnings"]
