"""Every access to vLLM's internals, behind one door.

AsyncLLM's public API cannot tell whether the engine request we named is
still running, nor which weight versions a running completion's tokens were
computed with (only finished outputs carry the spans), and its pause adds a
sleep that an update does not need. Those answers come from vLLM's private
state, which moves between releases: each function here says the vLLM
version and file it was read from, so an upgrade is a change to this file
alone (and a look at each function's source).
"""

from __future__ import annotations

import os
import threading


async def pause_scheduler(engine, mode: str) -> None:
    """Pauses the engine's scheduler without touching the caches; `mode` is
    vLLM's "abort" or "keep".

    Read from vLLM 0.32.0: `AsyncLLM.pause_generation(clear_cache=False)`
    (vllm/v1/engine/async_llm.py) is `engine_core.pause_scheduler_async`
    plus a fixed 20 ms sleep that only orders in-flight outputs for its
    caller; with nothing in flight it is pure latency on an update's
    critical path. An engine without that client takes the public call.
    """
    core = getattr(engine, "engine_core", None)
    if core is not None and hasattr(core, "pause_scheduler_async"):
        await core.pause_scheduler_async(mode=mode, clear_cache=False)
    else:
        await engine.pause_generation(mode=mode, clear_cache=False)


def request_running(engine, engine_id: str) -> bool:
    """Whether the engine still holds the request we submitted as `engine_id`.

    Read from vLLM 0.32.0: `OutputProcessor.external_req_ids`
    (vllm/v1/engine/output_processor.py) maps the id given to `generate` to
    its internal ids, and drops it once every one of them finished or was
    aborted. A defaultdict: `in` does not add the key.
    """
    return engine_id in engine.output_processor.external_req_ids


def weight_version_spans(engine, engine_id: str, index: int) -> list | None:
    """vLLM's weight-version spans (WeightVersionSpan) of the tokens that
    completion `index` of a running request has so far, or None when the
    request is gone or carries no labels.

    Read from vLLM 0.32.0 (vllm/v1/engine/output_processor.py): the engine
    core tags each step's outputs with its weight version, and
    `RequestState.track_weight_version` records where each version starts;
    `RequestState._weight_version_spans()` turns that into the spans that
    only a finished CompletionOutput carries. `OutputProcessor.request_states`
    is keyed by internal id, reached through `external_req_ids`.
    """
    outputs = engine.output_processor
    for internal in outputs.external_req_ids.get(engine_id, ()):
        state = outputs.request_states.get(internal)
        if state is not None and state.request_index == index:
            return state._weight_version_spans()
    return None


def rendered_prompt(engine, prompt: dict):
    """A token-ids prompt (no images) rendered as `AsyncLLM.generate` would
    render it itself, for a caller already off the event loop; the prompt as
    it is for an engine without an input processor (a stand-in).

    Read from vLLM 0.32.0: `InputProcessor.process_inputs`
    (vllm/v1/engine/input_processor.py) renders a raw prompt with
    `parse_model_prompt` and `renderer.render_cmpl` on the renderer's
    `default_cmpl_tok_params`, and takes a rendered one (a dict with a
    "type") as it is; `AsyncLLM.add_request` (vllm/v1/engine/async_llm.py) runs the raw
    case on a thread of its own, the rendered one inline. Rendered on the
    tokenizing thread, where the request is converted anyway, a request
    makes one thread hop instead of two (BENCHMARKS.md, against `vllm serve
    --grpc`, whose servicer renders before it calls generate too).
    """
    processor = getattr(engine, "input_processor", None)
    if processor is None:
        return prompt
    from vllm.renderers.inputs.preprocess import parse_model_prompt

    renderer = processor.renderer
    parsed = parse_model_prompt(processor.model_config, prompt)
    (out,) = renderer.render_cmpl([parsed], renderer.default_cmpl_tok_params.with_kwargs())
    return out


def skip_logprob_token_text(engine) -> None:
    """Stops the engine from decoding the text of every logprob's token,
    which nothing here reads: a response carries token ids and logprobs, and
    the HTTP front names tokens itself. The streamed text, detokenized
    incrementally, is untouched.

    Read from vLLM 0.32.0: `OutputProcessor.add_request`
    (vllm/v1/engine/output_processor.py) builds each request's
    `LogprobsProcessor` with the detokenizer's tokenizer, and
    `LogprobsProcessor._update_sample_logprobs` (vllm/v1/engine/logprobs.py) then decodes
    every position's tokens (`convert_ids_list_to_tokens`, and a decode of
    the context for each token that ends in half a character) into
    `Logprob.decoded_token`; with its `tokenizer` None it decodes nothing.
    That decoding was the larger part of what a stream with text cost more
    than one of ids (BENCHMARKS.md, against `vllm serve --grpc`). An engine
    without an output processor (a stand-in) is left as it is.
    """
    processor = getattr(engine, "output_processor", None)
    if processor is None:
        return
    add_request = processor.add_request

    def add_request_without_token_text(request, *args, **kwargs) -> None:
        add_request(request, *args, **kwargs)
        state = processor.request_states.get(request.request_id)
        if state is not None and state.logprobs_processor is not None:
            state.logprobs_processor.tokenizer = None

    processor.add_request = add_request_without_token_text


# Inside vLLM's worker processes (worker/): imported there too, so this module
# imports nothing of ours and no vLLM module at its top.


def serialize_reaping(engine) -> None:
    """One thread at a time asks whether an engine core process has ended.

    Read from vLLM 0.32.0: `CoreEngineProcManager.monitor_engine_liveness`
    (vllm/v1/engine/utils.py) reads `proc.exitcode` in a thread of its own
    once a process's sentinel fires, while `shutdown` (vllm/v1/utils.py)
    joins the same process in the caller's thread and then asks
    `is_alive()`. multiprocessing's `Popen.poll` is not safe across threads:
    when the monitor reaps the process first, the join's `waitpid` fails
    (ECHILD), `poll` answers None, and `is_alive()` says True for a process
    that has exited, so vLLM logs "force killing remaining processes" and
    kills what is left of its tree. A lock around each engine process's
    `poll` makes the two agree (tests/unit/server/test_engine_reaping.py).
    An engine without such processes (Ray's, in-process) is left alone.
    """
    resources = getattr(getattr(engine, "engine_core", None), "resources", None)
    manager = getattr(resources, "engine_manager", None)
    for proc in getattr(manager, "processes", None) or ():
        popen = getattr(proc, "_popen", None)
        if popen is not None:
            popen.poll = _one_at_a_time(popen.poll)


def _one_at_a_time(poll):
    lock = threading.Lock()

    def locked(flag: int = os.WNOHANG):
        with lock:
            return poll(flag)

    return locked


def restore_layer(layer, info) -> None:
    """Puts a layer whose layerwise reload was interrupted back on its
    kernel tensors, with its original weight loaders.

    Read from vLLM 0.32.0: `layerwise._get_original_loader` and
    `layerwise._place_kernel_tensors` (vllm/model_executor/model_loader/
    reload/layerwise.py) are what `finalize_layerwise_reload` uses to finish
    a layer; nothing public undoes an unfinished one.
    """
    from vllm.model_executor.model_loader.reload import layerwise
    from vllm.model_executor.model_loader.reload.utils import get_layer_tensors

    for tensor in get_layer_tensors(layer).values():
        if hasattr(tensor, "weight_loader"):
            tensor.weight_loader = layerwise._get_original_loader(tensor)
    if info.kernel_tensors is not None:
        layerwise._place_kernel_tensors(layer, info)


def restore_torchao_reload(model) -> None:
    """Undoes the reload's patch of a torchao model's `_do_torchao_reload`.

    Read from vLLM 0.32.0: `initialize_layerwise_reload` saves the original
    as `_original_do_torchao_reload` (reload/torchao_decorator.py).
    """
    if hasattr(model, "_original_do_torchao_reload"):
        model._do_torchao_reload = model._original_do_torchao_reload


def clear_weight_update_flag(worker) -> None:
    """Clears the worker's "weight update active" flag.

    Read from vLLM 0.32.0: `Worker._weight_update_active`
    (vllm/v1/worker/gpu_worker.py, the CPU worker inherits it) is cleared
    when `update_weights` raises, not when `finish_weight_update` does.
    """
    worker._weight_update_active = False


def omp_binding(environ) -> tuple[set[int], int] | None:
    """The CPUs and thread count vLLM set for the worker it is starting, or
    None when it set none (a GPU host, VLLM_CPU_OMP_THREADS_BIND=nobind).

    Read from vLLM 0.32.0: `OMPProcessManager.configure_omp_envs`
    (vllm/utils/ompmultiprocessing.py) binds a CPU worker only through the
    environment of the process it starts: OMP_NUM_THREADS, and the worker's
    CPUs as GOMP_CPU_AFFINITY ("0 1"), KMP_AFFINITY ("...,proclist=[0,1]")
    or OMP_PLACES ("{0,1}"), for the OpenMP runtime to read when it loads.
    """
    threads = environ.get("OMP_NUM_THREADS", "")
    if gomp := environ.get("GOMP_CPU_AFFINITY"):
        cpus = gomp.split()
    elif "proclist=[" in (kmp := environ.get("KMP_AFFINITY", "")):
        cpus = kmp.split("proclist=[", 1)[1].split("]", 1)[0].split(",")
    elif places := environ.get("OMP_PLACES", ""):
        cpus = places.strip("{}").split(",")
    else:
        return None
    try:
        return {int(c) for c in cpus}, int(threads)
    except ValueError:
        return None


def choose_engine_core_context(choose) -> bool:
    """Lets `choose(context)` replace the multiprocessing context vLLM starts
    its engine core processes with (core_fork.py); whether it could.

    Read from vLLM 0.32.0: `CoreEngineProcManager.__init__`
    (vllm/v1/engine/utils.py) calls `get_mp_context()`, imported into that
    module from vllm/utils/system_utils.py, and starts each engine core with
    `context.Process(target=EngineCoreProc.run_engine_core, ...).start()`.
    """
    from vllm.v1.engine import utils

    found = getattr(utils, "get_mp_context", None)
    if found is None:
        return False
    original = getattr(found, "chosen_from", found)

    def get_mp_context():
        return choose(original())

    get_mp_context.chosen_from = original  # type: ignore[attr-defined]
    utils.get_mp_context = get_mp_context
    return True


def unlink_cpu_shm_once_joined() -> bool:
    """Makes each rank of vLLM's CPU tensor-parallel communicator unlink the
    name of its shared memory segment once every rank has mapped it; whether
    it could. Idempotent.

    Each rank creates /dev/shm/<group>_<rank> (4 MiB for the embedded model)
    and the other ranks map it; vLLM unlinks it only in a C++ static
    destructor, which a worker never reaches (it ends with os._exit, as any
    forked process does; a kill ends it too): every TP=2 server left two
    segments behind, host memory until a reboot. Past the barrier that ends
    the setup the name serves nothing: the mappings live on without it.

    Read from vLLM 0.32.0: `_CPUSHMDistributed._init_cpu_shm`
    (vllm/distributed/device_communicators/cpu_communicator.py) creates the
    segment with `init_shm_manager(group_name, world_size, rank, ...)`, maps
    the others' with `join_shm_manager` and ends with a barrier of the group;
    csrc/cpu/shm.cpp names a rank's segment `<group_name>_<rank>`, maps all
    of them in `join`, and ignores the unlink's result at its end.
    """
    try:
        from vllm.distributed.device_communicators import cpu_communicator
    except ImportError:
        return False
    shm = getattr(cpu_communicator, "_CPUSHMDistributed", None)
    joined = getattr(shm, "_init_cpu_shm", None)
    if shm is None or joined is None:
        return False
    if getattr(joined, "unlinks", False):
        return True

    def _init_cpu_shm(self):
        # CPython's module behind multiprocessing.shared_memory (no stub)
        from _posixshmem import shm_unlink  # type: ignore[import-not-found]

        handle = joined(self)
        try:
            shm_unlink(f"/{self.group_name}_{self.communicator.rank}")
        except FileNotFoundError:
            pass
        return handle

    _init_cpu_shm.unlinks = True  # type: ignore[attr-defined]
    shm._init_cpu_shm = _init_cpu_shm
    return True
