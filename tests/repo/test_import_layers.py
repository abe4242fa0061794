"""The import rules are import-linter contracts ([tool.importlinter] in
pyproject.toml: the service's layers, the worker's few imports, the service
apart from the client, the codecs apart from both, a pipeline without gRPC,
the client's layers, no circles); here they are checked on the sources, and each is shown
breaking once, on a copy of the sources with one forbidden import per rule,
with the message a developer reads."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
COPIED = {
    "rollout_service": REPO / "rollout_service",
    "rollout_client": REPO / "client" / "rollout_client",
    "rollout_codecs": REPO / "client" / "rollout_codecs",
    "rollout": REPO / "client" / "rollout",
}

# One forbidden import per contract: the file it goes into, the import, and
# how import-linter names it in the contract's report.
BREAKS = {
    "the service imports only down its layers": (
        "rollout_service/ops/logs.py",
        "from rollout_service.rpc import handlers",
        "rollout_service.ops.logs -> rollout_service.rpc.handlers",
    ),
    "the worker imports only the ground and the engine's process hooks": (
        "rollout_service/worker/param_groups.py",
        "from rollout_service.ops import shapes",
        "rollout_service.worker.param_groups -> rollout_service.ops.shapes",
    ),
    "the service never imports the client (only the codecs both ship)": (
        "rollout_service/status/errors.py",
        "from rollout_client.calls import versions",
        "rollout_service.status.errors -> rollout_client.calls.versions",
    ),
    "the codecs import nothing of the client or the service": (
        "rollout_codecs/wire.py",
        "from rollout_service.status import errors",
        "rollout_codecs.wire -> rollout_service.status.errors",
    ),
    "the generation pipeline imports nothing of gRPC": (
        "rollout_service/pipeline/context.py",
        "if TYPE_CHECKING:\n    import grpc.aio",  # a TYPE_CHECKING import counts
        "rollout_service.pipeline.context -> grpc",
    ),
    "no module imports another in a circle": (
        "rollout_client/weights/manifest.py",  # push.py imports manifest.py
        "from rollout_client.weights import push",
        "No cycles are allowed in rollout_client.",
    ),
    "the client imports only down its packages": (
        "rollout_client/calls/versions.py",
        "from rollout_client import sessions",
        "rollout_client.calls.versions -> rollout_client.sessions",
    ),
    "the engine's process hooks import nothing of the worker": (
        "rollout_service/engine/parent_watch.py",
        "from rollout_service.worker import plugins",
        "rollout_service.engine.parent_watch -> rollout_service.worker.plugins",
    ),
}

# The layers' other rules: packages of one layer import none of each other,
# and the worker imports of the engine only its process hooks.
MORE_LAYER_BREAKS = [
    (
        "rollout_service/sessions/store.py",
        "from rollout_service.update import timings",
        "rollout_service.sessions.store -> rollout_service.update.timings",
    ),
    (
        "rollout_service/worker/reload_state.py",
        "from rollout_service.engine import startup",
        "rollout_service.worker.reload_state -> rollout_service.engine.startup",
    ),
]


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the packages under `root` (the repository's, or a copy's)."""
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache", "--no-logo", "--config", REPO / "pyproject.toml"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
        # COLUMNS: the report's lines unwrapped
        env={"PYTHONPATH": f"{root}:{root / 'client'}", "PATH": "", "COLUMNS": "200"},
    )


def test_the_sources_keep_every_import_contract():
    out = lint_imports(REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"Contracts: {len(BREAKS)} kept, 0 broken." in out.stdout, out.stdout


def test_each_contract_breaks_on_its_forbidden_import(tmp_path):
    for name, source in COPIED.items():
        into = tmp_path / ("client" if name.startswith("rollout_c") or name == "rollout" else "")
        ignore = shutil.ignore_patterns("__pycache__", "*.pyi", "*.typed")
        shutil.copytree(source, into / name, ignore=ignore)
    for path, line, _ in [*BREAKS.values(), *MORE_LAYER_BREAKS]:
        top = path.split("/")[0]
        file = (tmp_path if top == "rollout_service" else tmp_path / "client") / path
        text = file.read_text() if file.exists() else '"""A module."""\n'
        if "TYPE_CHECKING" in line and "TYPE_CHECKING" not in text:
            text += "\nfrom typing import TYPE_CHECKING\n"
        file.write_text(f"{text}\n{line}\n")
    out = lint_imports(tmp_path)
    report = out.stdout
    assert out.returncode == 1, report + out.stderr
    assert f"Contracts: 0 kept, {len(BREAKS)} broken." in report, report
    # each contract's report, under its name, names the import that breaks it
    sections = re.split(r"\n(?=[^\n]+\n-+\n)", report.split("Broken contracts")[1])
    by_name = {s.strip().split("\n")[0]: s for s in sections if s.strip()}
    for name, (_, _, shown) in BREAKS.items():
        assert name in by_name, (name, report)
        assert shown in by_name[name], (name, by_name[name])
    layers = by_name["the service imports only down its layers"]
    for _, _, shown in MORE_LAYER_BREAKS:
        assert shown in layers, (shown, layers)


def test_the_root_of_the_service_holds_only_the_process():
    root = {p.stem for p in (REPO / "rollout_service").glob("*.py")}
    assert root == {"__init__", "app", "cli", "config", "server", "start_checks"}
