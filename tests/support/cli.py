"""The `rollout-client` command against a server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CLI = str(Path(sys.executable).with_name("rollout-client"))


def run(server, *args, check=True):
    p = subprocess.run(
        [CLI, "--target", server.target, *args], capture_output=True, text=True, timeout=120
    )
    if check:
        assert p.returncode == 0, p.stderr
    return p
