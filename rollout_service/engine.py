"""Starting the vLLM engine and reading what the service needs from it."""

from __future__ import annotations

import glob
import logging
import os
import uuid
from dataclasses import dataclass

from rollout.v1 import rollout_pb2 as pb
from rollout_service import dtypes
from rollout_service.convert import ModelLimits
from rollout_service.plugins import register
from rollout_service.weights_backend import BACKEND_NAME

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineInfo:
    """Static facts about the served model."""

    model: str
    limits: ModelLimits
    # The tensors UpdateWeights accepts, by checkpoint-format name.
    manifest: dict[str, pb.TensorSpec]

    @property
    def model_bytes(self) -> int:
        return sum(dtypes.nbytes(s.dtype, s.shape) for s in self.manifest.values())


def build_engine(engine_args):  # -> AsyncLLM
    """Starts an AsyncLLM with this project's weight-transfer backend."""
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    register()  # the factory validates the backend name in this process too
    engine_args.weight_transfer_config = WeightTransferConfig(backend=BACKEND_NAME)
    return AsyncLLM.from_engine_args(engine_args, usage_context=UsageContext.API_SERVER)


def read_manifest(model_dir: str, served_dtype) -> dict[str, pb.TensorSpec]:
    """The checkpoint's tensors (names and shapes from the safetensors
    headers), with the dtype the engine serves them in."""
    from safetensors import safe_open

    manifest: dict[str, pb.TensorSpec] = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                shape = f.get_slice(name).get_shape()
                manifest[name] = pb.TensorSpec(
                    name=name, dtype=dtypes.from_torch(served_dtype), shape=shape
                )
    return manifest


def engine_info(engine, max_prompt_tokens: int | None = None) -> EngineInfo:
    """Reads the served model's limits and manifest from a running engine."""
    mc = engine.model_config
    limits = ModelLimits(
        vocab_size=mc.get_vocab_size(),
        max_model_len=mc.max_model_len,
        max_logprobs=max(mc.max_logprobs, 0),
        supports_images=bool(mc.is_multimodal_model),
        max_prompt_tokens=max_prompt_tokens,
    )
    manifest = read_manifest(mc.model, mc.dtype) if os.path.isdir(mc.model) else {}
    if not manifest:
        log.warning("no local safetensors found for %s: UpdateWeights accepts nothing", mc.model)
    return EngineInfo(model=mc.served_model_name or mc.model, limits=limits, manifest=manifest)


async def warm_up(engine) -> None:
    """Runs one tiny request with logprobs, so that the first real request
    does not pay for lazy initialisation (vLLM compiles its logprobs gather
    on the first request that asks for them)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=2, temperature=0.0, logprobs=1)
    async for _ in engine.generate(
        {"prompt_token_ids": [1, 2, 3]}, params, f"warm-up-{uuid.uuid4().hex[:8]}"
    ):
        pass
