"""vLLM's saved compiled model, skipped on a CPU host: loading it fails there.

vLLM (with torch 2.10 or newer) saves the model's torch.compile output
after a start (VLLM_USE_AOT_COMPILE, on by default) and loads it on the
next instead of compiling again. On a CPU host the model compiles in
vLLM's DYNAMO_TRACE_ONCE mode with torch's own Inductor backend, and vLLM
(0.32) loads that artifact as if it had compiled it its own way: every start
after the first logs "Compiling model again due to a load failure ...
'function' object has no attribute 'finalize_loading'", loads the file,
fails, compiles again and saves the file again.

With it off, vLLM compiles as it did before torch 2.10 (Inductor's own
cache): the same compiled model, without the failed load and the save.
Measured on the embedded model, the cache warm (BENCHMARKS.md): SERVING
in 21.4 to 22.8 s instead of 31.2 to 32.1 s, 24 to 25 CPU-seconds instead
of 33 to 34 (the worker's 7.0 instead of 13.6). Throughput: `benchmarks.ab --sides ours,ours --env
B:VLLM_USE_AOT_COMPILE=0 --loads unary,stream --rounds 3`, the median of B
over A 1.04x unary and 1.04x streamed (BENCHMARKS.md).

GPU hosts compile in VLLM_COMPILE mode, whose saved artifacts load: left
alone there, as is a value the user set.
"""

from __future__ import annotations

import os

AOT_ENV = "VLLM_USE_AOT_COMPILE"


def arm(cpu_host: bool) -> bool:
    """Called by the server before the engine starts (its processes inherit
    the environment): on a CPU host, unless the user set it, vLLM compiles
    without its saved artifact. Whether it was turned off."""
    if not cpu_host or AOT_ENV in os.environ:
        return False
    os.environ[AOT_ENV] = "0"
    return True
