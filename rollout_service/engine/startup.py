"""Starting the vLLM engine and reading what the service needs from it."""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import signal
import time
import uuid
from dataclasses import dataclass, field

from rollout.v1 import rollout_pb2 as pb
from rollout_codecs import dtypes
from rollout_service.engine import vllm_compat
from rollout_service.engine.limits import ModelLimits
from rollout_service.engine.protocol import Engine
from rollout_service.handoff.staged_tensor import BACKEND_NAME
from rollout_service.worker.plugins import register

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineInfo:
    """Static facts about the served model."""

    model: str
    limits: ModelLimits
    # The tensors UpdateWeights accepts, by checkpoint-format name.
    manifest: dict[str, pb.TensorSpec]
    # Tensors that load into one engine module, by module (param_groups.py).
    groups: dict[str, list[str]] = field(default_factory=dict)
    # Whether a KV connector is configured (its cache is reset with the rest).
    kv_connector: bool = False
    # Which distribution logprobs come from (vLLM's --logprobs-mode).
    logprobs_mode: pb.LogprobsMode = pb.LOGPROBS_MODE_RAW_LOGPROBS

    @property
    def model_bytes(self) -> int:
        return sum(dtypes.nbytes(s.dtype, s.shape) for s in self.manifest.values())


WORKER_EXTENSION = "rollout_service.worker.worker_ext.RolloutWorkerExtension"

# What start-up takes, measured with the embedded model on a 2-core x86 CPU
# machine (docs/operations.md, "Start-up"): the engine was up 15.9 to 16.2 s
# after it was asked for, at a load average of about 2; 34 to 137 s the
# first time on a machine or for a new checkpoint folder, when vLLM inspects
# the model in a subprocess and compiles it (both cached in ~/.cache/vllm),
# depending on what else ran. The warm-up after it took 1.5 to 3.4 s, and
# once 22 s, when vLLM compiled its logprobs kernel again.
ENGINE_START_USUALLY = (
    "usually 5 to 10 s for the embedded model on 2 CPU cores; up to 2 minutes the first "
    "time on a machine or for a new model, while vLLM compiles it (cached in ~/.cache/vllm)"
)
WARM_UP_USUALLY = "usually 2 to 3 s, up to half a minute if vLLM compiles its logprobs kernel"
# How often start-up says it is still going: no minute passes in silence.
STILL_STARTING_SECONDS = 30.0


class UnsupportedConfig(ValueError):
    """An engine configuration this service refuses at start, saying why."""


def check_supported(engine_args) -> None:
    """Refuses, before anything starts, what would break the update promise."""
    if engine_args.worker_extension_cls not in (None, "", WORKER_EXTENSION):
        raise UnsupportedConfig(
            f"--worker-extension-cls {engine_args.worker_extension_cls}: this service installs "
            f"its own ({WORKER_EXTENSION}) to load weights safely; vLLM takes only one"
        )
    # Tensor parallelism is supported (every rank maps the staging region and
    # loads its own shard; tests/engine/generation/test_parallel.py). The rest is refused until
    # it is built and tested:
    if (engine_args.pipeline_parallel_size or 1) > 1:
        raise UnsupportedConfig(
            "--pipeline-parallel-size: not supported yet: parameter groups are read from "
            "the first worker, which holds only its own stages, and weight updates through "
            "pipeline stages are untested; use --tensor-parallel-size"
        )
    if (engine_args.data_parallel_size or 1) > 1:
        raise UnsupportedConfig(
            "--data-parallel-size: not supported: every engine needs its own admission gate "
            "and update barrier; run one server per engine and use rollout_client.fleet.Fleet"
        )
    if engine_args.distributed_executor_backend == "ray":
        raise UnsupportedConfig(
            "--distributed-executor-backend ray: not supported yet: workers on other hosts "
            "cannot open this host's staging region (docs/scaling.md says how their bytes "
            "would reach them); use the default multiprocessing backend on one host"
        )
    kv = engine_args.kv_transfer_config
    if kv is not None:
        name = kv.kv_connector if hasattr(kv, "kv_connector") else kv.get("kv_connector")
        if not _connector_resets_its_cache(name):
            raise UnsupportedConfig(
                f"--kv-transfer-config: the KV connector {name!r} cannot reset its cache "
                "(it does not implement reset_cache), so KV computed under old weights could "
                "be served after an update; use a connector that does (e.g. "
                "OffloadingConnector) or none"
            )


def _connector_resets_its_cache(name: str | None) -> bool:
    """Whether vLLM's connector class overrides the base reset_cache (the
    base's does nothing and reports success: stale KV would survive)."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    if name is None:
        return False  # no connector named: the factory would refuse it too
    try:
        cls = KVConnectorFactory.get_connector_class_by_name(name)
    except ValueError:
        return False  # a connector we cannot inspect is refused, not trusted
    return cls.reset_cache is not KVConnectorBase_V1.reset_cache


def build_engine(engine_args) -> Engine:
    """Starts an AsyncLLM with this project's weight-transfer backend and
    worker extension."""
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    check_supported(engine_args)
    register()  # the factory validates the backend name in this process too
    engine_args.weight_transfer_config = WeightTransferConfig(backend=BACKEND_NAME)
    engine_args.worker_extension_cls = WORKER_EXTENSION
    engine = AsyncLLM.from_engine_args(engine_args, usage_context=UsageContext.API_SERVER)
    vllm_compat.skip_logprob_token_text(engine)
    vllm_compat.serialize_reaping(engine)
    return engine


def _build_engine_shielded(engine_args) -> Engine:
    """`build_engine` with SIGINT blocked in the calling thread, which every
    engine process inherits (a child keeps its parent's signal mask, and the
    engine core's forked workers keep its own).

    A terminal's Ctrl-C sends SIGINT to every process of its foreground group:
    the engine core and workers then start vLLM's own shutdown while this
    server starts its orderly one, and the two race. Measured: the server's
    SIGTERM found the engine core mid-teardown with its handler reset, killed
    it, and its shared memory was reported leaked at exit; during start-up
    the engine core died in its imports with a traceback. Blocked, SIGINT
    reaches only this server, which shuts them down in order (SIGTERM)."""
    from multiprocessing import resource_tracker

    # Launching the tracker unblocks SIGINT in the launching thread (Python
    # 3.11's resource_tracker.ensure_running); once running it is not
    # launched again.
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return build_engine(engine_args)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


async def start_engine(engine_args, stop: asyncio.Event) -> Engine:
    """The engine, built in a thread (its constructor blocks while it spawns
    and loads; the event loop, health included, answers meanwhile), saying
    what it does and, every STILL_STARTING_SECONDS, that it still is. vLLM's
    start cannot be interrupted: `stop` set meanwhile is only acknowledged,
    and the engine returned for the caller to shut down."""
    log.info("starting the engine (vLLM): %s", ENGINE_START_USUALLY)
    began = time.monotonic()
    start = asyncio.ensure_future(asyncio.to_thread(_build_engine_shielded, engine_args))
    stopping = asyncio.ensure_future(stop.wait())
    waiting = {start, stopping}
    while not start.done():
        done, _ = await asyncio.wait(
            waiting, timeout=STILL_STARTING_SECONDS, return_when=asyncio.FIRST_COMPLETED
        )
        if stopping in done:
            waiting.discard(stopping)
            log.info(
                "signal received during start-up: stopping once the engine is up, which "
                "cannot be interrupted (a second signal exits at once)"
            )
        elif not done:
            log.info("still starting the engine (%.0f s so far)", time.monotonic() - began)
    stopping.cancel()
    return start.result()


def read_manifest(model_dir: str) -> dict[str, pb.TensorSpec]:
    """The checkpoint's tensors: names, shapes and each tensor's own dtype,
    from the safetensors headers (a bf16 model may keep float32 norms or
    scales, or integer buffers; each loads as it is stored)."""
    from safetensors import safe_open

    manifest: dict[str, pb.TensorSpec] = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                manifest[name] = pb.TensorSpec(
                    name=name, dtype=dtypes.from_safetensors(sl.get_dtype()), shape=sl.get_shape()
                )
    return manifest


def model_limits(engine: Engine, max_prompt_tokens: int | None = None) -> ModelLimits:
    """The served model's limits, from a running engine."""
    mc = engine.model_config
    return ModelLimits(
        vocab_size=mc.get_vocab_size(),
        max_model_len=mc.max_model_len,
        max_logprobs=max(mc.max_logprobs, 0),
        supports_images=bool(mc.is_multimodal_model),
        max_prompt_tokens=max_prompt_tokens,
    )


async def engine_info(engine: Engine, max_prompt_tokens: int | None = None) -> EngineInfo:
    """Reads the served model's limits, manifest and parameter groups from a
    running engine."""
    mc = engine.model_config
    limits = model_limits(engine, max_prompt_tokens)
    # Once, at start-up, before serving: nothing else waits on the loop yet.
    manifest = read_manifest(mc.model) if os.path.isdir(mc.model) else {}  # noqa: ASYNC240
    if not manifest:
        log.warning("no local safetensors found for %s: UpdateWeights accepts nothing", mc.model)
    # Every worker holds the same modules; the first one answers.
    groups = (await engine.collective_rpc("rollout_parameter_groups", args=(list(manifest),)))[0]
    return EngineInfo(
        model=mc.served_model_name or mc.model,
        limits=limits,
        manifest=manifest,
        groups=groups,
        kv_connector=engine.vllm_config.kv_transfer_config is not None,
        # Value() gives an int (types-protobuf); protoc's .pyi types the field as LogprobsMode.
        logprobs_mode=pb.LogprobsMode.Value(f"LOGPROBS_MODE_{mc.logprobs_mode.upper()}"),  # type: ignore[arg-type]
    )


async def warm_up(engine: Engine) -> None:
    """Runs one tiny request with logprobs, so that the first real request
    does not pay for lazy initialisation (vLLM compiles its logprobs gather
    on the first request that asks for them)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=2, temperature=0.0, logprobs=1)
    async for _ in engine.generate(
        {"prompt_token_ids": [1, 2, 3]}, params, f"warm-up-{uuid.uuid4().hex[:8]}"
    ):
        pass


def settle() -> None:
    """Once the engine is up and warm: this process's start-up state is
    static from here on, and two of vLLM's per-step costs drop with that.

    - The start-up heap (vLLM, torch, the tokenizer) is frozen for the
      garbage collector, as `vllm serve` does. Measured under 64 concurrent
      calls: unfrozen, full collections of 0.45 to 0.56 s each (the event
      loop stalls meanwhile), 0.011 to 0.032 CPU s per 1,000 tokens of
      collection; frozen, 0.01 s and 0.003 to 0.006 (BENCHMARKS.md).
    - vLLM's settings (`vllm.envs`) are read once, as vLLM's engine core and
      workers do for themselves: uncached, every access reads os.environ
      (7 us here, against 1 us cached), and the output processor and the stat
      loggers read one per request per step. Measured: 0.010 to 0.021 CPU s
      less per 1,000 tokens of unary Generate (BENCHMARKS.md). A VLLM_*
      variable changed after start-up is not seen by this process.
    """
    from vllm.envs import enable_envs_cache
    from vllm.utils.gc_utils import freeze_gc_heap

    freeze_gc_heap()
    enable_envs_cache()
