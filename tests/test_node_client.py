"""The TypeScript client (client/node) end to end against the real server:
builds it with npm, runs its demo (info, generate, a weight push, generate,
reset) and checks the result through the Python client."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).resolve().parents[1] / "client" / "node"
# Quiet, non-interactive npm.
NPM_ENV = {
    **os.environ,
    "npm_config_fund": "false",
    "npm_config_audit": "false",
    "npm_config_update_notifier": "false",
}


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(
        cmd, cwd=NODE_DIR, env=NPM_ENV, capture_output=True, text=True, timeout=timeout
    )
    assert p.returncode == 0, (
        f"`{' '.join(cmd)}` exited {p.returncode} in {NODE_DIR}\n"
        f"--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-4000:]}"
    )
    return p


def _require_node() -> None:
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not found on PATH: the Node client test needs "
            "Node.js >= 18 with npm (install Node.js 20, e.g. from nodejs.org or the "
            "distribution's nodejs package)",
            pytrace=False,
        )


def _install_deps() -> None:
    """`npm ci` when node_modules is missing or older than package-lock.json."""
    installed = NODE_DIR / "node_modules" / ".package-lock.json"
    lock = NODE_DIR / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        _run(["npm", "ci"], timeout=600)


def test_node_client_demo(server, client):
    _require_node()
    _install_deps()
    _run(["npm", "run", "build"], timeout=300)

    version = f"node-{uuid.uuid4().hex[:12]}"
    p = _run(
        ["node", "dist/demo.js", "--target", server.target, "--version", version],
        timeout=600,
    )
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    assert lines, f"the demo printed nothing\n--- stderr\n{p.stderr}"
    result = json.loads(lines[-1])
    assert result["ok"] is True
    assert result["version"] == version
    assert 0 < len(result["tokens_before"]) <= 8
    assert 0 < len(result["tokens_after"]) <= 8

    # The Python client sees what the Node client pushed.
    assert client.server_info().weight_version == version
    r = client.generate(prompt_text="Hello from Node", max_tokens=8, temperature=0)
    assert r.weight_version == version
    # Same prompt, same greedy settings, same weights: the same tokens.
    assert list(r.completions[0].token_ids) == result["tokens_after"]
