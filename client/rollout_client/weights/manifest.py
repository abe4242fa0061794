"""An update checked against the served model's manifest (GetServerInfo's
`parameters`) before a byte of it is read or sent: a tensor the server would
refuse fails here, at once, with the name, dtype or shape it would take."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

import grpc

from rollout.v1 import rollout_pb2 as pb
from rollout_client.calls.connection import RolloutError
from rollout_codecs import dtypes, extras
from rollout_codecs.sources import SourceTensor


class ManifestMismatch(RolloutError, ValueError):
    """A tensor the server would refuse (unknown name, wrong dtype or
    shape), found before anything was sent. It carries what the server
    would have answered (code INVALID_ARGUMENT, reason INVALID_FIELD), so
    `except RolloutError` handles it with the server's own refusals; it is
    a ValueError too, as it always was."""

    def __init__(self, details: str) -> None:
        super().__init__(grpc.StatusCode.INVALID_ARGUMENT, details, "INVALID_FIELD")


def unknown_name(name: str, served: Iterable[str]) -> ManifestMismatch:
    """The refusal of a name the model does not have, with the served names
    closest to it: a typo, or a prefix that wrappers add (DDP's `module.`,
    torch.compile's `_orig_mod.`), is then one look away."""
    close = difflib.get_close_matches(name, list(served), n=3)
    hint = (
        f"; did you mean {' or '.join(close)}?"
        if close
        else "; server_info().parameters (`rollout-client info --json`) lists the served names"
    )
    return ManifestMismatch(f"{name}: not a parameter of the served model{hint}")


def describe(
    tensors: Sequence[SourceTensor],
    manifest: Sequence[pb.TensorSpec] | None,
    checksum: bool = False,
) -> list[pb.TensorSpec]:
    """The begin message's tensor specs, checked against the manifest (when
    given) before a byte is read or sent. `checksum` reads every tensor once
    more, to declare its CRC-32C."""
    expected = {s.name: s for s in manifest} if manifest is not None else None
    specs = []
    for t in tensors:
        if expected is not None:
            want = expected.get(t.name)
            if want is None:
                raise unknown_name(t.name, expected)
            if want.dtype != t.dtype:
                raise ManifestMismatch(
                    f"{t.name}: dtype {dtypes.name(t.dtype)}, the server takes "
                    f"{dtypes.name(want.dtype)}"
                )
            if list(want.shape) != t.shape:
                raise ManifestMismatch(
                    f"{t.name}: shape {t.shape}, the server takes {list(want.shape)}"
                )
        spec = pb.TensorSpec(name=t.name, dtype=t.dtype, shape=t.shape)
        if checksum:
            crc32c = extras.require("crc32c", "checksum=True").crc32c
            crc = 0
            for _, data in t.chunks(1 << 24):
                crc = crc32c(data, crc)
            spec.crc32c = crc
        specs.append(spec)
    if not specs:
        raise ValueError("the weight source holds no tensors")
    return specs
