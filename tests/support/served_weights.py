"""What a server shared between test modules serves, and putting back the
weights it started on (conftest's `_left_clean` does, after each module).

A fingerprint is the served weight version and a short greedy generation
with its logprobs: another version, or other weights under the same name,
change it. The restore pushes the served checkpoint's own files back under
the version the server started with, so a module that follows sees exactly
what a fresh server shows, whatever ran before it."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from pathlib import Path

import grpc

from rollout_client import RolloutClient, pb
from rollout_service.engine.tiny_models import ensure_model

PROMPT = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38]
TOKENS = 8
# Logprobs of the same weights differ in their last bits between a cold
# prompt and one read from the prefix cache; other weights differ by far more.
LOGPROB_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Fingerprint:
    version: str  # GetServerInfo's
    generated_by: str  # the generation's weight_version
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]

    def matches(self, other: Fingerprint) -> bool:
        return (
            (self.version, self.generated_by, self.tokens)
            == (other.version, other.generated_by, other.tokens)
            and len(self.logprobs) == len(other.logprobs)
            and all(
                math.isclose(a, b, rel_tol=0, abs_tol=LOGPROB_TOLERANCE)
                for a, b in zip(self.logprobs, other.logprobs)
            )
        )

    def __str__(self) -> str:
        lps = ", ".join(f"{lp:.4f}" for lp in self.logprobs)
        return f"version {self.version!r}: tokens {list(self.tokens)}, logprobs [{lps}]"


def fingerprint(client: RolloutClient) -> Fingerprint:
    version = client.server_info().weight_version
    r = client.generate(
        prompt_token_ids=PROMPT, max_tokens=TOKENS, temperature=0, ignore_eos=True, logprobs=0
    )
    c = r.completions[0]
    return Fingerprint(version, r.weight_version, tuple(c.token_ids), tuple(c.logprobs))


def served_checkpoint(client: RolloutClient) -> Path:
    """The folder of the checkpoint the server serves: GetServerInfo's model,
    a folder, or an embedded model's name (served from the folder
    tiny_models.ensure_model built, in the same cache: servers started by
    harness.serverproc inherit the environment)."""
    model = client.server_info().model
    folder = Path(model)
    if not folder.is_dir():
        try:
            folder = ensure_model(model)
        except ValueError:
            raise RuntimeError(f"the served model {model!r} is not a local folder") from None
    if not any(folder.glob("*.safetensors")):
        raise RuntimeError(f"the served model's folder {str(folder)!r} holds no safetensors")
    return folder


def restore(client: RolloutClient, start: Fingerprint, checkpoint: Path) -> None:
    """Pushes `checkpoint` back under `start`'s version (a full update: every
    tensor, the caches reset)."""
    if client.server_info().weight_version == start.version:
        # Other weights under the starting version's name: a version is never
        # pushed twice in a row, so another name comes first.
        client.update_weights(checkpoint, f"{start.version}-restoring-{uuid.uuid4().hex[:8]}")
    client.update_weights(checkpoint, start.version)


def update_left_open(client: RolloutClient) -> str | None:
    """Why a staged update is still open (GetServerInfo does not say): a
    BeginUpdate of one lone tensor is refused ABORTED while another update is
    open or applying; opened, it is aborted at once. None if nothing is open."""
    info = client.server_info()
    grouped = {n for g in info.parameter_groups for n in g.names}
    lone = next(p for p in info.parameters if p.name not in grouped)
    begin = pb.UpdateWeightsBegin(
        weight_version=f"open-update-probe-{uuid.uuid4().hex[:8]}",
        tensors=[pb.TensorSpec(name=lone.name, dtype=lone.dtype, shape=lone.shape)],
    )
    metadata = client.options.metadata()
    try:
        opened = client.stub.BeginUpdate(
            pb.BeginUpdateRequest(begin=begin), metadata=metadata, timeout=30
        )
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.ABORTED:
            return e.details()
        raise
    client.stub.AbortUpdate(
        pb.AbortUpdateRequest(update_id=opened.update_id), metadata=metadata, timeout=30
    )
    return None
