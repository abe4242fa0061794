"""The `rollout-service serve` command run to its end, for configurations
refused at start (no engine is started for them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SERVE = str(Path(sys.executable).with_name("rollout-service"))


def serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SERVE, "serve", "--port", "0", *args], capture_output=True, text=True, timeout=120
    )
