"""The hand-off between the update path (server process) and the weight
backend (vLLM worker processes): where each staged tensor lies.

Both sides import this one type, so the tie shows in the imports. It crosses
the process boundary as a plain dict (vLLM's IPC encodes dicts, not our
classes): `as_wire()` on the server side, `from_wire()` in the worker.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# The weight-transfer backend's name: the engine is configured with it, the
# updater initializes it, the worker registers it (weights_backend.py).
BACKEND_NAME = "rollout_shm"


@dataclass(frozen=True)
class StagedTensor:
    """One checkpoint-format tensor lying in the staging segment."""

    name: str
    # torch dtype name, e.g. "bfloat16" (rollout_codecs.dtypes)
    dtype: str
    shape: tuple[int, ...]
    # Byte offset inside the segment, and size (0 for an empty tensor).
    offset: int
    nbytes: int

    def as_wire(self) -> dict:
        return asdict(self)

    @classmethod
    def from_wire(cls, d: dict) -> StagedTensor:
        return cls(
            name=d["name"],
            dtype=d["dtype"],
            shape=tuple(d["shape"]),
            offset=d["offset"],
            nbytes=d["nbytes"],
        )
