"""No module of the service or the client imports another in a circle, not
even under TYPE_CHECKING (a circle broken only at run time still ties the
modules into one): read from the sources, without importing them."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {
    "rollout_service": REPO / "rollout_service",
    "rollout_client": REPO / "client" / "rollout_client",
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
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
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


def test_no_module_imports_another_in_a_circle():
    mods = modules()
    graph = {m: imports(p, m, set(mods)) for m, p in mods.items()}
    assert cycles(graph) == []


def test_a_circle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
