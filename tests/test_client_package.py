"""The Python client as a package of its own: `pip install ./client` into a
fresh venv without vllm, torch or numpy, on the oldest grpcio and protobuf it
declares and on the newest, then every basic call against the real server."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from safetensors.torch import save_file

from harness.weights_util import random_weights, version

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = ("numpy", "torch", "tqdm", "crc32c", "safetensors")

# Run in the fresh venv: argv is target, a safetensors file, a version.
CHECK = """
import asyncio, importlib.util, json, sys
import rollout_client
from rollout_client import AsyncRolloutClient, RolloutClient, RolloutError
loaded = sorted(m for m in sys.modules if m.split(".")[0] in OPTIONAL)
target, weights, new_version = sys.argv[1:4]
p = dict(prompt_token_ids=[5, 6, 7], max_tokens=4, temperature=0, ignore_eos=True)
with RolloutClient(target, timeout=120) as c:
    c.wait_until_ready(60)
    info = c.server_info()
    r = c.generate(**p)
    streamed = [t for d in c.generate_stream(**p) for t in d.token_ids]
    reset = c.reset_caches()
    try:
        c.generate(prompt_text="x", n=0)
        refused = None
    except RolloutError as e:
        refused = e.code.name
    ack = c.update_weights(weights, new_version)  # a file: read without numpy
    after = c.generate(**p)

async def on_asyncio():
    async with AsyncRolloutClient(target, timeout=120) as a:
        await a.wait_until_ready(60)
        return (await a.generate(**p)).weight_version

import google.protobuf, grpc
print(json.dumps({
    "loaded": loaded,
    "installed": [m for m in OPTIONAL if importlib.util.find_spec(m)],
    "protobuf": google.protobuf.__version__, "grpcio": grpc.__version__,
    "model": info.model, "tokens": list(r.completions[0].token_ids), "streamed": streamed,
    "caches": len(reset.results), "refused": refused, "ack": ack.weight_version,
    "after": after.weight_version, "async": asyncio.run(on_asyncio()),
}))
""".replace("OPTIONAL", repr(OPTIONAL))


def fresh_venv(path: Path, *pins: str) -> Path:
    """A venv at `path` with ./client (copied first: the package must need
    nothing outside client/) and `pins` installed; returns its python."""
    src = path.parent / "client-src"
    shutil.copytree(
        ROOT / "client",
        src,
        ignore=shutil.ignore_patterns("node", "cpp", "__pycache__", "build", "*.egg-info"),
    )
    venv.create(path, with_pip=True)
    python = path / "bin" / "python"
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", src, *pins],
        check=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    return python


@pytest.mark.parametrize(
    "pins",
    [
        # the floors client/pyproject.toml declares (and GRPC_GENERATED_VERSION)
        ("grpcio==1.66.2", "grpcio-health-checking==1.66.2", "protobuf==5.29.1"),
        ("protobuf>=6,<7",),
        (),  # the newest of everything
    ],
    ids=["oldest", "protobuf6", "newest"],
)
def test_client_package_in_a_clean_venv(server, info, tmp_path, pins):
    python = fresh_venv(tmp_path / "venv", *pins)
    head = [p for p in info.parameters if p.name == "lm_head.weight"]
    weights = tmp_path / "head.safetensors"
    save_file(random_weights(head, seed=77), weights)
    v = version()
    out = subprocess.run(
        [python, "-c", CHECK, server.target, str(weights), v],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,  # not the repository: its packages must not be importable
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["installed"] == [] and got["loaded"] == []
    if pins and pins[-1] == "protobuf==5.29.1":
        assert (got["protobuf"], got["grpcio"]) == ("5.29.1", "1.66.2")
    elif pins:
        assert got["protobuf"].startswith("6.")
    else:
        assert int(got["protobuf"].split(".")[0]) >= 7
    assert got["model"] == info.model
    assert len(got["tokens"]) == 4 and got["streamed"] == got["tokens"]
    assert got["caches"] >= 3
    assert got["refused"] == "INVALID_ARGUMENT"
    assert got["ack"] == got["after"] == got["async"] == v
    # the console script and the typing markers came along
    cli = subprocess.run(
        [python.with_name("rollout-client"), "--target", server.target, "--json", "info"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["model"] == info.model
    site = subprocess.run(
        [python, "-c", "import rollout, rollout_client; print(rollout_client.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    pkg = Path(site.stdout.strip()).parent
    for marker in ("rollout_client/py.typed", "rollout/py.typed", "rollout/v1/rollout_pb2.pyi"):
        assert (pkg.parent / marker).is_file(), marker


def test_importing_the_client_loads_no_optional_package():
    """Here every optional package is installed: none may load until a
    feature needs it."""
    code = (
        "import sys, rollout_client, rollout_client.cli, rollout_client.fleet\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {OPTIONAL!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_server_ships_what_the_client_needs():
    """The server's pyproject maps the client's packages instead of depending
    on the rollout-client distribution, so it must carry its dependencies."""
    tomllib = pytest.importorskip("tomllib")

    def names(requirements):
        return {re.match(r"[\w.-]+", r).group().lower() for r in requirements}

    server = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    client = tomllib.loads((ROOT / "client" / "pyproject.toml").read_text())["project"]
    assert names(client["dependencies"]) <= names(server["dependencies"])
    assert names(client["optional-dependencies"]["weights"]) <= names(server["dependencies"])
    assert client["scripts"] == {"rollout-client": server["scripts"]["rollout-client"]}
    assert client["version"] == server["version"]
