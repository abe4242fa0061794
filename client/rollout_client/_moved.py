"""The deprecated import paths of modules that moved, out of rollout_client
(the codecs, to rollout_codecs) or into its packages by concern (calls/,
weights/, fleet/): each old module is one call to `alias`, which warns and
puts the new module in its place (so `from rollout_client.wire import X` and
`rollout_client.wire.X` keep working until the old paths go in 0.3)."""

from __future__ import annotations

import importlib
import sys
import warnings


def alias(old: str, new: str) -> None:
    warnings.warn(
        f"{old} moved to {new}; the old path goes in 0.3",
        DeprecationWarning,
        stacklevel=3,
    )
    sys.modules[old] = importlib.import_module(new)
