"""The first value of an update: its plan, from the begin message alone.

`plan_update` validates everything begin says against what the update may
write (its Target: the served model's manifest, or one adapter's) and lays
its tensors out in the staging region (its Placement), before a byte is
received or the engine is touched: names, dtypes and shapes, encodings and
their sizes, fused groups, the delta base, the size limit, the pause mode.
The contract's static rules (the version's length, known enum values, a
positive drain timeout: status/static_rules.py) are held where begin enters
(transfers.WeightTransfers.begin), before this.
Pure: a plan is computed, never stored anywhere but in the values that
follow it (upload.py, received.py), and tested without an engine.

Where the bytes go: a full update writes each tensor into its slot of the
staging region (delta_base.py: the region laid out as the whole model), or,
when the region is smaller than the model, packed in begin's order. A delta
update, and an update naming the served version (a possible retry, which
must not touch the served bytes), are packed into the incoming region
instead; a delta is decoded into the slots later (delta_load.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rollout.v1 import rollout_pb2 as pb
from rollout_codecs import delta, dtypes
from rollout_service.handoff.region import ALIGN, StagingRegion, StagingSpaceError
from rollout_service.status.errors import FailedPrecondition, InvalidArgument, ResourceExhausted


@dataclass(frozen=True)
class Placement:
    """Where the updater lets an update's bytes go."""

    staging: StagingRegion
    # name -> slot offset in `staging` (delta_base.slot_layout); None: the
    # region is smaller than the model, full updates are packed.
    slots: dict[str, int] | None = None
    # Deltas and possible retries; None: packed in `staging` (tests).
    incoming: StagingRegion | None = None
    # GetServerInfo.delta_base_version now, and why it is empty when it is.
    delta_base: str = ""
    no_base_why: str = "this server keeps no delta base"


@dataclass(frozen=True)
class AdapterConfig:
    """What an adapter update writes beside its tensors (lora.py)."""

    peft: dict
    rank: int


@dataclass(frozen=True)
class Target:
    """What an update may write: the served model's parameters, or one
    LoRA adapter's tensors (then `adapter` is set; lora.py)."""

    manifest: Mapping[str, pb.TensorSpec]
    current_version: str
    # name -> every name of its group (param_groups.py); absent: alone.
    groups: Mapping[str, Sequence[str]] = field(default_factory=dict)
    # The served version may be named again by a retry of the update that
    # installed it: the applier then compares contents (base_weights.py).
    replayable_version: str | None = None
    # Why PAUSE_MODE_KEEP cannot be honoured on this server, if it cannot.
    keep_refusal: str | None = None
    # An adapter removal carries no tensors.
    allow_empty: bool = False
    adapter: AdapterConfig | None = None


@dataclass(frozen=True)
class PlannedTensor:
    spec: pb.TensorSpec
    # Where its bytes go in the region, and how many travel (the encoded
    # bytes of an encoded tensor).
    offset: int
    nbytes: int
    wire_nbytes: int


@dataclass(frozen=True)
class UpdatePlan:
    """A validated begin: what each tensor is and where its bytes go."""

    begin: pb.UpdateWeightsBegin
    target: Target
    placement: Placement
    tensors: tuple[PlannedTensor, ...]
    # The region the bytes are written into, and the bytes of it they take.
    region: StagingRegion
    end: int
    max_update_bytes: int
    # Packed in begin's order (not into the slots of the served model).
    packed: bool
    # Names the served version: a possible retry, compared, never loaded.
    retry: bool

    @property
    def names(self) -> set[str]:
        return {t.spec.name for t in self.tensors}

    @property
    def total_bytes(self) -> int:
        return sum(t.wire_nbytes for t in self.tensors)

    @property
    def tensor_offsets(self) -> list[int]:
        """Where each tensor of begin lies in the region."""
        return [t.offset for t in self.tensors]

    @property
    def writes_slots(self) -> bool:
        """Its bytes overwrite slots of the served model (the transfer
        marks each stale as its first byte comes: upload.py's `writing`,
        DeltaBase.writing)."""
        return not self.packed

    def reserve(self) -> memoryview:
        """Makes the region hold the update and returns it. Growing it (a
        delta larger than any before it) allocates and faults in its pages:
        time that grows with the update, so callers run it in a thread
        (WeightTransfers.begin). The incoming region grows with a quarter to
        spare, so that the next steps' deltas, a little larger or smaller,
        fit without growing it again."""
        room = min(self.end // 4, max(self.max_update_bytes - self.end, 0)) if self.packed else 0
        grows = self.region.size < self.end
        try:
            return self.region.ensure(self.end, prefault=grows, room=room)
        except StagingSpaceError as e:
            raise ResourceExhausted(
                f"begin.tensors: the update's {self.end} bytes do not fit: {e}"
            ) from None


def plan_update(
    begin: pb.UpdateWeightsBegin, target: Target, placement: Placement, max_update_bytes: int
) -> UpdatePlan:
    """Validates `begin` against `target` and lays it out in `placement`."""
    _check_begin(begin, target)
    # Naming the served version: a possible retry of the update that
    # installed it (base_weights.py compares), never decoded or loaded.
    retry = begin.weight_version == target.current_version
    is_delta = bool(begin.base_version)
    _check_base(begin, placement, retry)
    packed = is_delta or retry or placement.slots is None
    region = (
        placement.incoming
        if packed and placement.incoming is not None and placement.slots is not None
        else placement.staging
    )
    tensors: list[PlannedTensor] = []
    seen: set[str] = set()
    offset = 0
    for i, spec in enumerate(begin.tensors):
        where = f"begin.tensors[{i}]"
        _check_spec(where, spec, target.manifest.get(spec.name), seen)
        seen.add(spec.name)
        nbytes = dtypes.nbytes(spec.dtype, spec.shape)
        wire = _wire_bytes(where, spec, nbytes, is_delta)
        at = offset if packed else placement.slots[spec.name]  # type: ignore[index]
        tensors.append(PlannedTensor(spec=spec, offset=at, nbytes=nbytes, wire_nbytes=wire))
        offset += -(-wire // ALIGN) * ALIGN
    if not is_delta:
        _check_groups(begin, target.groups, seen)
    if offset > max_update_bytes:
        raise ResourceExhausted(
            f"begin.tensors: the update is {offset} bytes, over the limit of "
            f"{max_update_bytes} bytes (max_update_bytes)"
        )
    return UpdatePlan(
        begin=begin,
        target=target,
        placement=placement,
        tensors=tuple(tensors),
        region=region,
        end=max((t.offset + t.wire_nbytes for t in tensors), default=0),
        max_update_bytes=max_update_bytes,
        packed=packed,
        retry=retry,
    )


def _check_begin(begin: pb.UpdateWeightsBegin, target: Target) -> None:
    if begin.weight_version == target.current_version != target.replayable_version:
        raise FailedPrecondition(
            f"begin.weight_version: {begin.weight_version!r} is already the served version",
            reason=pb.ERROR_REASON_VERSION_ALREADY_SERVED,
        )
    if not begin.tensors and not target.allow_empty:
        raise InvalidArgument("begin.tensors", "must name at least one tensor")
    if begin.pause_mode == pb.PAUSE_MODE_KEEP and target.keep_refusal:
        raise InvalidArgument("begin.pause_mode", target.keep_refusal)


def _check_base(begin: pb.UpdateWeightsBegin, placement: Placement, retry: bool) -> None:
    """A delta's base: the server's, unless the update is a possible retry
    (the base has moved on to the version it installed)."""
    if not begin.base_version:
        return
    if begin.HasField("adapter"):
        raise InvalidArgument(
            "begin.base_version",
            "a delta applies to the base weights; an adapter update sends its tensors raw",
        )
    if retry or begin.base_version == placement.delta_base:
        return
    have = (
        f"its base is {placement.delta_base!r}" if placement.delta_base else placement.no_base_why
    )
    raise FailedPrecondition(
        f"begin.base_version: {begin.base_version!r} is not this server's delta base "
        f"({have}; GetServerInfo.delta_base_version); push a full update",
        reason=pb.ERROR_REASON_DELTA_BASE_MISMATCH,
    )


def _check_spec(
    where: str, spec: pb.TensorSpec, expected: pb.TensorSpec | None, seen: set[str]
) -> None:
    if expected is None:
        raise InvalidArgument(
            f"{where}.name", f"{spec.name!r} is not a parameter of the served model"
        )
    if spec.name in seen:
        raise InvalidArgument(f"{where}.name", f"{spec.name!r} is declared twice")
    if spec.dtype != expected.dtype:
        raise InvalidArgument(
            f"{where}.dtype",
            f"{spec.name}: got {dtypes.name(spec.dtype)}, "
            f"the model takes {dtypes.name(expected.dtype)}",
        )
    if list(spec.shape) != list(expected.shape):
        raise InvalidArgument(
            f"{where}.shape",
            f"{spec.name}: got {list(spec.shape)}, the model takes {list(expected.shape)}",
        )


def _wire_bytes(where: str, spec: pb.TensorSpec, nbytes: int, is_delta: bool) -> int:
    """How many bytes of the tensor travel; refuses a bad encoding."""
    enc = spec.encoding
    if is_delta and not spec.HasField("crc32c"):
        raise InvalidArgument(
            f"{where}.crc32c",
            f"{spec.name}: every tensor of a delta update declares the CRC-32C of its "
            "bytes (as reconstructed)",
        )
    if delta.is_raw(enc):
        if spec.encoded_bytes:
            raise InvalidArgument(
                f"{where}.encoded_bytes", f"{spec.name}: set only for an encoded tensor"
            )
        return nbytes
    if not is_delta:
        raise InvalidArgument(
            f"{where}.encoding",
            f"{spec.name}: {pb.TensorEncoding.Name(enc)} needs begin.base_version",
        )
    if nbytes % delta.element(enc).itemsize:
        raise InvalidArgument(
            f"{where}.encoding",
            f"{spec.name}: {nbytes} bytes, not whole 16-bit words: send it raw or as SPARSE_XOR8",
        )
    most = delta.max_encoded_bytes(enc, nbytes)
    if not 0 < spec.encoded_bytes <= most:
        raise InvalidArgument(
            f"{where}.encoded_bytes",
            f"{spec.name}: {spec.encoded_bytes}, must be 1 to {most} for "
            f"{pb.TensorEncoding.Name(enc)} of {nbytes} bytes",
        )
    return spec.encoded_bytes


def _check_groups(
    begin: pb.UpdateWeightsBegin, groups: Mapping[str, Sequence[str]], names: set[str]
) -> None:
    """Every tensor of a fused module, or none (see param_groups.py)."""
    for i, spec in enumerate(begin.tensors):
        group = groups.get(spec.name, ())
        missing = [n for n in group if n not in names]
        if missing:
            raise InvalidArgument(
                f"begin.tensors[{i}].name",
                f"{spec.name} loads into one engine module together with "
                f"{', '.join(missing)}: send all {len(group)} tensors of that group or none "
                "(GetServerInfo.parameter_groups lists the groups)",
            )
