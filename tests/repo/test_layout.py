"""The suite's layout: no file under tests/ imports a test module or the
conftest. Shared helpers live in tests/support/, shared fixtures in
conftest.py (pytest provides them). ruff bans `tests.conftest` by name
(tests/ruff.toml) but cannot ban a pattern like tests.test_*; this does both."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import orchestration

TESTS = Path(__file__).resolve().parents[1]


def _banned(module: str) -> bool:
    """tests.test_x, tests.unit.x.test_y.z, tests.conftest (absolute names:
    a test module in any folder of tests/)."""
    parts = module.split(".")
    return (
        len(parts) >= 2
        and parts[0] == "tests"
        and (parts[1] == "conftest" or any(p.startswith("test_") for p in parts[1:]))
    )


def _imported(node: ast.AST, package: str) -> list[str]:
    """The absolute module names an import statement imports from: for
    `from a import b`, a, or a.b when a is a package (b may be a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        parts = package.split(".")
        base = parts[: len(parts) - node.level + 1]
        module = ".".join([*base, *([node.module] if node.module else [])])
    else:
        module = node.module or ""
    if _banned(module):
        return [module]
    return [f"{module}.{alias.name}" for alias in node.names]


def bad_imports(root: Path) -> list[str]:
    """`file:line: module` for every import of a test module or the conftest
    in the Python files under `root` (a tests/ folder)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        package = ".".join(["tests", *rel.parent.parts])
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for module in _imported(node, package):
                if _banned(module):
                    found.append(f"tests/{rel.as_posix()}:{node.lineno}: {module}")
    return found


def test_no_test_module_or_conftest_is_imported():
    found = bad_imports(TESTS)
    assert not found, (
        "test modules and the conftest are not imported (helpers go to tests/support/, "
        "fixtures to conftest.py):\n" + "\n".join(found)
    )


def test_every_kind_of_such_import_is_caught(tmp_path):
    (tmp_path / "support").mkdir()
    (tmp_path / "test_a.py").write_text(
        "import tests.test_b\n"
        "from tests import test_b, support\n"
        "from tests.test_b import X\n"
        "from . import test_b as b\n"
        "from .conftest import ADMIN\n"
        "def f():\n"
        "    from tests.conftest import Y\n"
        "from tests.support.lora import CONFIG\n"  # allowed
    )
    (tmp_path / "support" / "x.py").write_text("from ..test_b import X\nfrom . import lora\n")
    (tmp_path / "unit").mkdir()
    (tmp_path / "unit" / "test_c.py").write_text(
        "from tests.engine.weights.test_d import Y\nfrom ..repo import test_e\n"
    )
    assert bad_imports(tmp_path) == [
        "tests/support/x.py:1: tests.test_b",
        "tests/test_a.py:1: tests.test_b",
        "tests/test_a.py:2: tests.test_b",
        "tests/test_a.py:3: tests.test_b",
        "tests/test_a.py:4: tests.test_b",
        "tests/test_a.py:5: tests.conftest",
        "tests/test_a.py:7: tests.conftest",
        "tests/unit/test_c.py:1: tests.engine.weights.test_d",
        "tests/unit/test_c.py:2: tests.repo.test_e",
    ]


def test_the_engine_free_folders_refuse_an_engine_test():
    """tests/unit/ and tests/repo/ hold no test that needs an engine: the
    collection refuses one (tests/support/orchestration.py); the other
    folders take both kinds."""
    assert orchestration.misplaced("tests/unit/generation/x::t", True)
    assert orchestration.misplaced("tests/repo/x::t", True)
    assert not orchestration.misplaced("tests/unit/generation/x::t", False)
    assert not orchestration.misplaced("tests/engine/weights/x::t", True)
    assert not orchestration.misplaced("tests/clients/x::t", True)
