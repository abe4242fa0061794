"""The TypeScript client (client/node) packed with `npm pack` and installed
into an empty folder, as a user installs it (conftest's `packed`), and npm
run quietly."""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NODE_DIR = REPO / "client" / "node"
PACKAGE = "@rollout/client-node"
# Quiet, non-interactive npm.
NPM_ENV = {
    **{k: v for k, v in os.environ.items() if k != "ROLLOUT_TOKEN"},
    "npm_config_fund": "false",
    "npm_config_audit": "false",
    "npm_config_update_notifier": "false",
}


def run(cmd: list[str], cwd: Path, timeout: float, env=None, check=True):
    p = subprocess.run(
        cmd, cwd=cwd, env=env or NPM_ENV, capture_output=True, text=True, timeout=timeout
    )
    if check:
        assert p.returncode == 0, (
            f"`{' '.join(cmd)}` exited {p.returncode} in {cwd}\n"
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


def _install_build_deps() -> None:
    """`npm ci` in client/node when node_modules is missing or older than
    package-lock.json (typescript and proto-loader-gen-types build the package)."""
    installed = NODE_DIR / "node_modules" / ".package-lock.json"
    lock = NODE_DIR / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        run(["npm", "ci"], NODE_DIR, timeout=600)


class Packed:
    """The packed tarball and the empty folder it was installed into."""

    def __init__(self, tarball: Path, files: list[str], app: Path) -> None:
        self.tarball = tarball
        self.files = files
        self.app = app
        self.root = app / "node_modules" / Path(*PACKAGE.split("/"))
        self.demo = app / "node_modules" / ".bin" / "rollout-node-demo"

    def demo_run(self, *args: str, token: str | None = None, timeout: float = 600):
        """Runs the installed demo command from the install folder."""
        env = dict(NPM_ENV)
        if token is not None:
            env["ROLLOUT_TOKEN"] = token
        return run([str(self.demo), *args], self.app, timeout, env=env, check=False)


_packed: list[Packed] = []
_packing = threading.Lock()


def packed_once() -> Packed:
    """client/node packed and installed once for the whole run (conftest's
    `packed`; the keepalive scenario may want it first, in its thread): once
    for both of its processes when the engine-free tests have a companion
    (tests/support/companion.py), the first to get there packing under a
    lock and the other reading what it packed (two `npm pack` at once in
    client/node would build over each other)."""
    # Imported here: conftest.py imports this module before pytest loads
    # companion as its plugin (which it then could not assert-rewrite).
    from tests.support import companion

    with _packing:
        if not _packed:
            _packed.append(_packed_for(companion.shared_folder()))
        return _packed[0]


def _pack_into(root: Path) -> Packed:
    (root / "pack").mkdir()
    (root / "app").mkdir()
    return pack_and_install(root / "pack", root / "app")


def _packed_for(shared: Path | None) -> Packed:
    if shared is None:
        root = Path(tempfile.mkdtemp(prefix="rollout-node-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        return _pack_into(root)
    root = shared / "node"
    root.mkdir(exist_ok=True)
    lock = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        answer = root / "packed.json"
        if not answer.exists():
            done = _pack_into(root)
            saved = {"tarball": str(done.tarball), "files": done.files, "app": str(done.app)}
            answer.write_text(json.dumps(saved))
        saved = json.loads(answer.read_text())
        return Packed(Path(saved["tarball"]), saved["files"], Path(saved["app"]))
    finally:
        os.close(lock)


def pack_and_install(dest: Path, app: Path) -> Packed:
    """client/node packed into `dest`, and installed into `app`, an empty
    folder outside the repository."""
    _require_node()
    _install_build_deps()
    # prepack builds: proto copied in, types generated from it, tsc.
    p = run(["npm", "pack", "--json", "--pack-destination", str(dest)], NODE_DIR, 600)
    (entry,) = json.loads(p.stdout)
    tarball = dest / entry["filename"]
    assert re.fullmatch(r"rollout-client-node-.+\.tgz", tarball.name), tarball.name
    assert tarball.is_file()

    assert not any(app.iterdir())
    run(["npm", "init", "-y"], app, 120)
    run(["npm", "install", "--no-audit", "--no-fund", str(tarball)], app, 600)
    return Packed(tarball, [f["path"] for f in entry["files"]], app)


# The head of a Node script that talks to a server with bearer tokens and
# mutual TLS (conftest's `shared_secure`), after its `require` of the client:
# `cfg` is its JSON argument (`secure_cfg`), `client` a RolloutClient with
# 120 s deadlines and no retries.
SECURE_CLIENT_JS = """
const fs = require("node:fs");
const readline = require("node:readline");
const cfg = JSON.parse(process.argv[2]);
const client = new RolloutClient(cfg.target, {
  token: cfg.token, timeoutMs: 120000, retries: 0,
  rootCertificates: fs.readFileSync(cfg.ca),
  certificateChain: fs.readFileSync(cfg.cert), privateKey: fs.readFileSync(cfg.key),
});
"""


def secure_cfg(secure, token: str, **more) -> dict:
    """SECURE_CLIENT_JS's `cfg` for `secure` (conftest's Secure) and `token`."""
    certs = secure.certs
    return {
        "target": secure.proc.target,
        "token": token,
        "ca": str(certs["ca"]),
        "cert": str(certs["client"]),
        "key": str(certs["client_key"]),
        **more,
    }


def start_script(packed: Packed, name: str, source: str, cfg: dict) -> subprocess.Popen[str]:
    """`source` written as `name` in the install folder and started with
    `cfg` as its JSON argument, its standard streams piped (text)."""
    script = packed.app / name
    script.write_text(source)
    return subprocess.Popen(
        ["node", str(script), json.dumps(cfg)],
        cwd=packed.app,
        env=NPM_ENV,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
