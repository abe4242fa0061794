"""Runs in the verl venv (tests/verl_env/build.py): imports what every drive
script here imports (torch, Ray, verl, the plugin's client), then runs the
drive script its first line of stdin names, as `python <script>` would, the
rest of stdin being that script's own input.

tests/support/verl_drive.py starts one ahead of each drive, so that the next
drive's imports (about 5 s of one core) run while the current drive mostly
waits on Ray and the servers, instead of at its start."""

from __future__ import annotations

import runpy
import sys

import ray  # noqa: F401
import torch  # noqa: F401
import verl  # noqa: F401
from verl.workers.rollout.llm_server import LLMServerManager  # noqa: F401

import rollout_client  # noqa: F401

if __name__ == "__main__":
    script = sys.stdin.readline().strip()
    sys.argv = [script]
    runpy.run_path(script, run_name="__main__")
