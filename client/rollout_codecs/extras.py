"""The optional dependencies (client/pyproject.toml's extras), imported only
by the features that use them: `import rollout_client`, generate, server info,
cache resets and updates from safetensors files need none of them."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, feature: str, extra: str = "weights") -> ModuleType:
    """`module`, or an ImportError that names the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"{feature} needs the {module.split('.')[0]} package: "
            f"pip install './client[{extra}]' from a checkout of the repository"
        ) from e
