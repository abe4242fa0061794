"""What the README's shell sessions (`buf curl`, `grpcurl`) need in tests:
the venv's tools, one way to run them, and the facts they are checked against."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rollout_client import pb

README = Path(__file__).resolve().parents[2] / "docs" / "shell.md"


def venv_tool(name: str) -> str:
    """A command installed into the venv by `scripts/setup --dev`."""
    return str(Path(sys.executable).with_name(name))


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def rollout_methods() -> set[str]:
    """Every RPC of the proto, as reflection names it: `rollout.v1.RolloutService/Generate`."""
    service = pb.DESCRIPTOR.services_by_name["RolloutService"]
    return {f"{service.full_name}/{m.name}" for m in service.methods}
