"""The import rules, read from the sources without importing them, every
import counted (TYPE_CHECKING ones too: a circle broken only at run time
still ties the modules into one):

- no module of the service or the client imports another in a circle;
- the service's packages import only down its layers (LAYERS, as
  docs/architecture.md draws them), never up nor across;
- the worker's code (it runs inside vLLM's processes) imports only the ground
  and the engine's process hooks;
- the generation pipeline imports nothing of gRPC: a second front (HTTP)
  calls it without the gRPC transport.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {
    "rollout_service": REPO / "rollout_service",
    "rollout_client": REPO / "client" / "rollout_client",
    "rollout_codecs": REPO / "client" / "rollout_codecs",
}


def modules() -> dict[str, Path]:
    out = {}
    for name, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            parts = [name, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports(path: Path, module: str, known: set[str]) -> set[str]:
    """The modules of `known` that `module` (at `path`) imports, anywhere in it."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            # `from pkg import mod` imports mod (and runs pkg/__init__, a docstring here)
            subs = [f"{base}.{a.name}" for a in node.names]
            names = [n for n in subs if n in known] or [base]
        for n in names:
            # the deepest known module the name is or lies in
            while n and n not in known:
                n = n.rpartition(".")[0]
            if n and n != module and n not in PACKAGES:
                found.add(n)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each circle once, as the modules on it (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


# rollout_service's packages and root modules, top down. A layer may import
# the layers below it; within a layer only the process modules and the
# ground import each other. `rollout_codecs` (the codecs the server shares
# with the client: wire, delta, dtypes, sources) counts as ground; the
# client (`rollout_client`) is in no layer: the service never imports it.
LAYERS = [
    {"cli", "server", "app", "config"},
    {"rpc", "http"},
    {"pipeline"},
    {"sessions", "update", "fairness"},
    {"generation"},
    {"engine"},
    {"worker"},
    {"ops"},
    {"status", "handoff", "rollout_codecs"},
]
WITHIN = {0, len(LAYERS) - 1}
# What the worker may import besides the ground: the one door to vLLM's
# private state, and the engine's process hooks, which vLLM's plugin entry
# point arms in every process it starts.
WORKER_HOOKS = {
    "rollout_service.engine.vllm_compat",
    "rollout_service.engine.parent_watch",
    "rollout_service.engine.worker_fork",
    "rollout_service.engine.tiny_models",
}


def part(module: str) -> str:
    """The layer unit a module belongs to: its package under rollout_service,
    or the root module's name; the client and the codecs are a unit each."""
    parts = module.split(".")
    return parts[1] if parts[0] == "rollout_service" else parts[0]


def violations(graph: dict[str, set[str]]) -> list[str]:
    layer = {p: i for i, ps in enumerate(LAYERS) for p in ps}
    found = []
    for a, targets in sorted(graph.items()):
        if not a.startswith("rollout_service."):
            continue
        for b in sorted(targets):
            pa, pb = part(a), part(b)
            if pa == pb:
                continue
            if pa == "worker":
                ok = layer[pb] == len(LAYERS) - 1 or b in WORKER_HOOKS
            elif pb not in layer:
                ok = False
            else:
                la, lb = layer[pa], layer[pb]
                ok = la < lb or (la == lb and la in WITHIN)
            if not ok:
                found.append(f"{a} -> {b}")
    return found


# Packages a front other than gRPC calls: they import no gRPC module
# themselves (their errors are RpcErrors, which each front maps to statuses).
NO_GRPC = {"pipeline", "http"}


def grpc_imports(path: Path) -> set[str]:
    """The gRPC modules the source at `path` imports: grpc, grpc_* and the
    generated *_pb2_grpc stubs."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
        for n in names:
            top = n.split(".")[0]
            if top == "grpc" or top.startswith("grpc_") or n.endswith("_pb2_grpc"):
                found.add(n)
    return found


def test_the_pipeline_imports_nothing_of_grpc():
    mods = modules()
    used = {
        m: sorted(grpc_imports(p))
        for m, p in mods.items()
        if m.startswith("rollout_service.") and part(m) in NO_GRPC
    }
    assert used and all(not found for found in used.values()), used


def test_a_grpc_import_is_caught(tmp_path):
    source = tmp_path / "front.txt"
    source.write_text(
        "import grpc.aio\nfrom grpc_status import rpc_status\nfrom rollout.v1 import rollout_pb2\n"
        "from rollout.v1 import rollout_pb2_grpc\n"
    )
    assert grpc_imports(source) == {
        "grpc.aio",
        "grpc_status",
        "grpc_status.rpc_status",
        "rollout.v1.rollout_pb2_grpc",
    }


def test_the_service_imports_only_down_its_layers():
    mods = modules()
    graph = {m: imports(p, m, set(mods)) for m, p in mods.items()}
    assert violations(graph) == []


def test_an_upward_import_is_caught():
    assert violations({"rollout_service.ops.auth": {"rollout_service.rpc.calls"}}) == [
        "rollout_service.ops.auth -> rollout_service.rpc.calls"
    ]
    assert violations({"rollout_service.sessions.turns": {"rollout_service.update.lora"}})
    assert violations({"rollout_service.pipeline.generations": {"rollout_service.rpc.handlers"}})
    assert violations({"rollout_service.worker.plugins": {"rollout_service.engine.startup"}})
    assert not violations({"rollout_service.worker.plugins": WORKER_HOOKS})
    # the service depends on the shared codecs, never on the client
    assert violations({"rollout_service.update.lora": {"rollout_client.push"}})
    assert not violations({"rollout_service.update.lora": {"rollout_codecs.dtypes"}})


def test_the_codecs_import_nothing_of_the_client_or_the_service():
    mods = modules()
    for m, p in mods.items():
        if m.startswith("rollout_codecs"):
            assert {d.split(".")[0] for d in imports(p, m, set(mods))} <= {"rollout_codecs"}, m


def test_the_root_of_the_service_holds_only_the_process():
    root = {p.stem for p in PACKAGES["rollout_service"].glob("*.py")}
    assert root == {"__init__", "app", "cli", "config", "server"}


def test_no_module_imports_another_in_a_circle():
    mods = modules()
    graph = {m: imports(p, m, set(mods)) for m, p in mods.items()}
    assert cycles(graph) == []


def test_a_circle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
