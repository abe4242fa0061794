"""A version names one set of weights for the server's lifetime.

Every token is tagged with the version that produced it, and a trainer
attributes its rollouts by that name; if `step-1` could name other weights
after `step-2`, one name would mean two models in the trainer's data. So a
version the server served earlier is refused (FAILED_PRECONDITION,
ERROR_REASON_VERSION_REUSED) unless the update carries the very weights it
named then: a full update (every parameter, not a delta) whose tensors hash
to the same digest. That keeps a retry, a replica healed to a version, and
putting the starting weights back under their own name working.

What is kept per version is a 32-byte digest of its full weights' content
(every tensor's name, dtype, shape and CRC-32C, in name order), or None when
the version was not a full update (a subset of tensors or a delta: what it
named depends on what came before it, so it cannot be pushed again). The
starting version's digest comes from the checkpoint's bytes in the delta
base, when the server keeps one.

Re-pushing the served version itself is the replay path (base_weights.py).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable, Mapping

import crc32c

from rollout.v1 import rollout_pb2 as pb
from rollout_codecs import dtypes
from rollout_service.status.errors import FailedPrecondition


def digest(content: Iterable[tuple]) -> bytes:
    """The digest of a full update's content (ReceivedUpdate.content)."""
    return hashlib.sha256(repr(sorted(content)).encode()).digest()


def slots_digest(
    view: memoryview, offsets: Mapping[str, int], manifest: Mapping[str, pb.TensorSpec]
) -> bytes | None:
    """The digest of the weights lying in the delta base's slots, as a full
    update of them would have it; None when some parameter has no slot."""
    content = []
    for name, spec in manifest.items():
        at = offsets.get(name)
        if at is None:
            return None
        n = dtypes.nbytes(spec.dtype, spec.shape)
        content.append(
            (
                name,
                dtypes.torch_name(spec.dtype),
                tuple(spec.shape),
                crc32c.crc32c(view[at : at + n]),
            )
        )
    return digest(content)


class VersionNames:
    """The versions served so far, and what each named."""

    def __init__(self) -> None:
        self._named: dict[str, bytes | None] = {}

    def __contains__(self, version: str) -> bool:
        return version in self._named

    def served(self, version: str, named: bytes | None) -> None:
        self._named[version] = named

    def served_as(self, version: str, content: asyncio.Future | None) -> None:
        """`version` is served now; `content` (a future of a full update's
        ReceivedUpdate.content, None otherwise) says what it names once
        computed."""
        self._named[version] = None
        if content is None:
            return

        def named(f: asyncio.Future) -> None:
            if not f.cancelled() and f.exception() is None and self._named.get(version) is None:
                self._named[version] = digest(f.result())

        content.add_done_callback(named)

    def check_begin(self, begin: pb.UpdateWeightsBegin, full: bool) -> None:
        """Refuses at begin, before a byte is read, a reused version that
        cannot be the same weights (this update or the earlier one was not
        a full update)."""
        version = begin.weight_version
        if version not in self._named:
            return
        if not full or self._named[version] is None:
            raise self._reused(
                version, "and only a full update of the same weights may name it again"
            )

    def check_bytes(self, version: str, content: Iterable[tuple]) -> None:
        """Refuses a full update under a reused version whose weights differ."""
        if version in self._named and self._named[version] != digest(content):
            raise self._reused(version, "with other weights than these")

    @staticmethod
    def _reused(version: str, why: str) -> FailedPrecondition:
        return FailedPrecondition(
            f"begin.weight_version: {version!r} was served earlier in this server's lifetime, "
            f"{why}; a version names one set of weights for the server's lifetime, so that "
            "every token tagged with it came from the same weights: push these weights under "
            "a new version",
            reason=pb.ERROR_REASON_VERSION_REUSED,
        )
