"""Which checkpoint tensors travel together in an update.

vLLM loads checkpoint tensors into its own modules, fusing some: q/k/v
projections into one `qkv_proj`, gate/up into `gate_up_proj`, experts into
one fused module. Its layerwise reload writes a module only once all of its
elements have arrived, and finalises a module that got only some of them
over freshly allocated memory. So an update must carry every checkpoint
tensor of each module it touches, or none of them.

Honouring a partial group instead would need the companions' current
checkpoint-format values, which the engine no longer has (on CPU the linear
weights are repacked for oneDNN after loading); keeping a second full copy
of the model in host memory for that is a cost every user would pay. So a
partial group is refused at `begin`, naming what is missing, and
GetServerInfo lists the groups.

The grouping runs in the worker (it needs the model's modules), through
`worker_ext.RolloutWorkerExtension`; the function itself is pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping


def module_of(
    name: str,
    modules: set[str],
    map_name: Callable[[str], str | None] | None,
    packed: Mapping[str, Iterable[str]],
) -> str:
    """The vLLM module a checkpoint tensor loads into.

    The model's own name mapping (which also fuses q/k/v into qkv_proj) goes
    first, then its packed-modules table; the path is then shortened until it
    names an existing module. Shortening errs on the safe side: a coarser
    module only makes a group bigger, never splits one.
    """
    mapped = map_name(name) if map_name is not None else name
    if mapped is None:  # the model ignores this tensor
        return name
    parts = mapped.split(".")[:-1]
    if ".".join(parts) not in modules:
        shard_to_fused = {s: fused for fused, shards in packed.items() for s in shards}
        parts = [shard_to_fused.get(p, p) for p in parts]
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts)


def group(
    names: Iterable[str],
    modules: set[str],
    map_name: Callable[[str], str | None] | None,
    packed: Mapping[str, Iterable[str]],
) -> dict[str, list[str]]:
    """Checkpoint tensor names by the module they load into, for modules
    that more than one tensor loads into (the others travel alone)."""
    by_module: dict[str, list[str]] = {}
    for name in names:
        by_module.setdefault(module_of(name, modules, map_name, packed), []).append(name)
    return {m: sorted(ns) for m, ns in sorted(by_module.items()) if len(ns) > 1}


def model_groups(model, names: Iterable[str]) -> dict[str, list[str]]:
    """`group` for a live vLLM model (run inside a worker)."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    return group(
        names,
        {n for n, _ in model.named_modules()},
        mapper.map_name if mapper is not None else None,
        getattr(model, "packed_modules_mapping", {}) or {},
    )
