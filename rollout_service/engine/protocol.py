"""The engine as the service sees it: the part of vLLM's `AsyncLLM` it calls.

Every object that holds the engine types it as `Engine`, so what the service
asks of vLLM is one list, read here, and a stand-in engine for a test knows
what it must answer. Signatures are AsyncLLM's (vLLM 0.32.0,
vllm/v1/engine/async_llm.py), narrowed to the arguments we pass. vLLM's
private state (the engine core client, the output processor) is not here:
only `vllm_compat.py` reaches it, and it takes the engine untyped for that.

mypy does not follow vLLM (pyproject.toml), so the vLLM types named below are
`Any` to it: the check is on our side of each call (names, arity, keywords).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import ModelConfig, VllmConfig
    from vllm.distributed.weight_transfer.base import (
        WeightTransferInitRequest,
        WeightTransferUpdateRequest,
    )
    from vllm.lora.request import LoRARequest
    from vllm.outputs import RequestOutput
    from vllm.tokenizers import TokenizerLike


class Engine(Protocol):
    """What the service calls on vLLM's AsyncLLM, grouped by who calls it."""

    # Start-up and facts (engine/startup.py, app.py, generation/tokenizing.py).
    model_config: ModelConfig
    vllm_config: VllmConfig

    def get_tokenizer(self) -> TokenizerLike: ...

    async def update_weight_version(self, new_version: str) -> None: ...

    # Liveness and shutdown (server.py, rpc/servicer.py).
    @property
    def errored(self) -> bool: ...

    def shutdown(self, timeout: float | None = None) -> None: ...

    # Generation (rpc/servicer.py, engine/startup.py's warm-up).
    def generate(
        self,
        prompt: Any,
        sampling_params: SamplingParams,
        request_id: str,
        *,
        lora_request: LoRARequest | None = None,
        trace_headers: Mapping[str, str] | None = None,
        priority: int = 0,
    ) -> AsyncGenerator[RequestOutput, None]: ...

    async def abort(self, request_id: str | Iterable[str], internal: bool = False) -> None: ...

    def get_num_unfinished_requests(self) -> int: ...

    # The quiesce (update/quiesce.py; pausing goes through vllm_compat.py).
    async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None: ...

    async def resume_generation(self) -> None: ...

    async def reset_prefix_cache(
        self, reset_running_requests: bool = False, reset_connector: bool = False
    ) -> bool: ...

    async def reset_mm_cache(self) -> None: ...

    async def reset_encoder_cache(self) -> None: ...

    # Base weights (update/base_weights.py) and the workers' own methods
    # (worker/worker_ext.py, through collective_rpc).
    async def init_weight_transfer_engine(self, request: WeightTransferInitRequest) -> None: ...

    async def start_weight_update(self) -> None: ...

    async def update_weights(self, request: WeightTransferUpdateRequest) -> None: ...

    async def finish_weight_update(self, weight_version: str | None = None) -> None: ...

    async def collective_rpc(
        self,
        method: str,
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]: ...

    # LoRA adapters (update/lora.py).
    async def add_lora(self, lora_request: LoRARequest) -> bool: ...

    async def remove_lora(self, lora_id: int) -> bool: ...

    # Sleep mode (update/sleep.py).
    async def sleep(self, level: int = 1) -> None: ...

    async def wake_up(self, tags: list[str] | None = None) -> bool: ...
