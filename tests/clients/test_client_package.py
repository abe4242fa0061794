"""The Python client as a package of its own: ./client installed into a fresh
venv without vllm, torch or numpy, on the oldest grpcio and protobuf it
declares, on protobuf 6 and on the newest, then every basic call against the
real server.

How, and why it is still what `pip install ./client` gives a trainer:
- The wheel is built once for the module, by `uv build --wheel` from a copy of
  client/ alone (so the package can need nothing outside client/), in an
  isolated build environment that holds only what client/pyproject.toml's
  [build-system] declares. That is what pip does for `pip install ./client`
  (PEP 517, the same setuptools backend, no sdist), and the wheel does not
  depend on the pins: building it once per case only cost 3 s each.
- Each case gets its own venv from the stdlib (`venv.create`, as `python -m
  venv` makes it: the base interpreter, no system site-packages), without
  pip: seeding pip took 7 s a case and nothing in the venv runs pip.
  `uv pip install --python <venv>` installs the wheel and the case's pins
  into it, resolved from PyPI (a second, against 12 s for the venv's own
  pip), with the same files as pip's install, the console script included.
  `--no-config`: no uv.toml of the machine or of a directory above can change
  what is resolved; the versions the check reports are asserted anyway.
- PYTHONPATH is dropped for the build, the install and every run (the console
  script's and the check's alike), and the runs start in tmp_path: nothing
  of the repository or of .venv (where vllm, torch and numpy are) is
  importable there. The check asserts it: no optional package can be found,
  and rollout_client was imported from the venv's site-packages.
uv comes from the dev extra (pyproject.toml), so `scripts/setup --dev`
installs it. Its cache hardly matters: on a cold one (a fresh CI machine) a
case took about 2 s, server calls included, as on a warm one."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest
from safetensors.torch import save_file
from uv import find_uv_bin

from harness.weights_util import random_weights, version

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = ("numpy", "torch", "tqdm", "crc32c", "safetensors")

# Run in the fresh venv: argv is target, a safetensors file, a version.
CHECK = """
import asyncio, importlib.util, json, sys
import rollout, rollout_client
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
    "file": rollout_client.__file__,
}))
""".replace("OPTIONAL", repr(OPTIONAL))


def clean_env() -> dict[str, str]:
    """The environment of every subprocess here: without PYTHONPATH, which
    points into the repository (the client's packages among them)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def client_wheel(tmp_path_factory) -> Path:
    """The wheel of ./client, built from a copy of client/ alone (the package
    must need nothing outside client/), once for the three venvs."""
    tmp = tmp_path_factory.mktemp("client-wheel")
    src = tmp / "client-src"
    shutil.copytree(
        ROOT / "client",
        src,
        ignore=shutil.ignore_patterns("node", "cpp", "__pycache__", "build", "*.egg-info"),
    )
    out = tmp / "dist"
    subprocess.run(
        [find_uv_bin(), "build", "--quiet", "--no-config", "--wheel"]
        + ["--python", sys.executable, "--out-dir", out, src],
        check=True,
        cwd=tmp,
        env=clean_env(),
    )
    (wheel,) = out.glob("rollout_client-*.whl")
    return wheel


def fresh_venv(path: Path, wheel: Path, *pins: str) -> Path:
    """A venv at `path` with `wheel` and `pins` installed; returns its python."""
    venv.create(path, with_pip=False)
    python = path / "bin" / "python"
    subprocess.run(
        [find_uv_bin(), "pip", "install", "--quiet", "--no-config", "--python", python]
        + [wheel, *pins],
        check=True,
        cwd=path.parent,
        env=clean_env(),
    )
    return python


@pytest.mark.parametrize(
    "pins",
    [
        # the floors client/pyproject.toml declares (and GRPC_GENERATED_VERSION)
        (
            "grpcio==1.66.2",
            "grpcio-health-checking==1.66.2",
            "grpcio-status==1.66.2",
            "protobuf==5.29.1",
        ),
        ("protobuf>=6,<7",),
        (),  # the newest of everything
    ],
    ids=["oldest", "protobuf6", "newest"],
)
def test_client_package_in_a_clean_venv(server, info, client_wheel, tmp_path, pins):
    python = fresh_venv(tmp_path / "venv", client_wheel, *pins)
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
        env=clean_env(),
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
        env=clean_env(),  # with PYTHONPATH, the script would run the repository's client
    )
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["model"] == info.model
    # where the check imported rollout_client from: the venv's site-packages
    pkg = Path(got["file"]).parent
    assert pkg.is_relative_to(python.parent.parent), pkg
    for marker in (
        "rollout_client/py.typed",
        "rollout/py.typed",
        "rollout/v1/rollout_pb2.pyi",
        "rollout/v1/rollout_pb2_grpc.pyi",
    ):
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

    def names(requirements):
        return {re.match(r"[\w.-]+", r).group().lower() for r in requirements}

    server = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    client = tomllib.loads((ROOT / "client" / "pyproject.toml").read_text())["project"]
    assert names(client["dependencies"]) <= names(server["dependencies"])
    assert names(client["optional-dependencies"]["weights"]) <= names(server["dependencies"])
    assert client["scripts"] == {"rollout-client": server["scripts"]["rollout-client"]}
    assert client["version"] == server["version"]


def test_every_package_of_the_server_is_shipped():
    """[tool.setuptools] lists the packages by hand: a package missing there
    is absent from a wheel (`pip install .`, an image) though an editable
    install still finds it (the sessions, fairness and handoff packages were)."""
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "rollout_service").rglob("__init__.py")
    }
    assert on_disk <= listed, sorted(on_disk - listed)


def test_every_package_of_the_client_is_shipped():
    """The same for the client's packages (calls/, weights/, fleet/ and the
    rest), in both distributions that ship them: the server's and
    rollout-client's own."""
    client = ROOT / "client"
    on_disk = {
        ".".join(p.parent.relative_to(client).parts)
        for top in ("rollout_client", "rollout_codecs", "rollout")
        for p in (client / top).rglob("__init__.py")
    }
    for pyproject in (ROOT / "pyproject.toml", client / "pyproject.toml"):
        listed = set(tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["packages"])
        assert on_disk <= listed, (pyproject, sorted(on_disk - listed))
