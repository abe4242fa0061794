"""What a weight update takes: the keyword options of `update_weights`, the
sync and the asyncio client's, typed once here (as generate's are in
generate_request.py), so that neither surface lists them again to hand them
on; absent, each has the default its comment names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict

from rollout.v1 import rollout_pb2 as pb
from rollout_client.calls.generate_request import check_names


class UpdateOptions(TypedDict, total=False):
    """RolloutClient.update_weights' options (its docstring says more)."""

    # PAUSE_MODE_WAIT: calls in flight finish first (ABORT, KEEP: rollout.proto).
    pause_mode: pb.PauseMode
    chunk_bytes: int  # bytes per chunk message; 1 MiB
    checksum: bool  # CRC-32C of every tensor, checked by the server; False
    progress: bool  # a tqdm bar of the bytes sent; False
    timeout: float | None  # the whole update's deadline; the client's
    drain_timeout_seconds: float | None  # the wait for calls in flight (WAIT); the server's
    streams: int  # connections uploading at once; 1
    same_host: bool  # written straight into the server's staging region; False
    adapter: str | None  # a LoRA adapter's name: `source` is its tensors; None
    adapter_config: dict[str, Any] | None  # PEFT's adapter_config.json, with `adapter`
    # True: the cheaper of a delta and a full update; "always": a delta when possible.
    delta: bool | Literal["always"]


_NAMES = frozenset(UpdateOptions.__annotations__)
# What push.prepare takes (its defaults are the ones above).
_BEGIN = ("pause_mode", "chunk_bytes", "checksum", "drain_timeout_seconds")


def check(options: Mapping[str, object]) -> None:
    """Python's TypeError for an unknown option, naming the nearest one."""
    check_names(options, _NAMES)


def begin(options: UpdateOptions) -> dict[str, Any]:
    """The options push.prepare takes. A delta push reads no checksum (its
    own encoding checks what changed)."""
    names = [n for n in _BEGIN if not (n == "checksum" and options.get("delta"))]
    return {n: options[n] for n in names if n in options}  # type: ignore[literal-required]
