"""Every code block of README.md and docs/*.md runs as written, in file order,
against a real server: a snippet that stops working fails here.

Python blocks run with the repository's .venv/bin/python, in a folder of
their own; shell blocks run with bash from the repository root, a file's
variables carried from one of its shell blocks to the next. The documents'
addresses, 127.0.0.1:50051 (gRPC) and 127.0.0.1:8000 (HTTP), are replaced by the
server's, and each run says so.
The server is the shared one (conftest's `server`): the weights the snippets push
are put back after the module, as after every module.

Blocks marked on the line before their fence (tests/support/snippets.py says
how) are not run: `skip` (a GPU, Kubernetes, a fragment of a program of your
own, the server command itself) and `setup` (installs and builds the suite's
own setup covers: no test here installs anything). They are listed by
test_every_block_runs_or_is_marked, which fails on a block that is neither
runnable nor marked.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.support import snippets

REPO = Path(__file__).resolve().parents[3]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DOC_TARGET = "127.0.0.1:50051"
DOC_HTTP = "127.0.0.1:8000"  # the HTTP front's (--http-port 8000)
PYTHON = REPO / ".venv" / "bin" / "python"
RUN_DOCS = [doc for doc in DOCS if any(b.kind for b in snippets.blocks(doc))]


def _name(doc: Path) -> str:
    return str(doc.relative_to(REPO))


def test_every_block_runs_or_is_marked():
    not_run = [b for doc in DOCS for b in snippets.blocks(doc) if b.mark]
    print(f"\n{len(not_run)} blocks not run here:")
    for b in not_run:
        print(f"  {_name(b.doc)}:{b.line} ({b.lang}) {b.mark}: {b.reason}")
    assert not [p for doc in DOCS for p in snippets.problems(doc)]
    # Each document the suite reads is here; the README's quickstart runs.
    readme = [b for b in snippets.blocks(DOCS[0]) if b.kind]
    assert {b.kind for b in readme} == {"python", "sh"}


@pytest.mark.timeout(900)  # the TRL example and the reference loop train for real
@pytest.mark.parametrize("doc", RUN_DOCS, ids=_name)
def test_snippets_run(doc, server, tmp_path):
    target = server.target
    state = tmp_path / "shell-variables.sh"
    for block in snippets.blocks(doc):
        if not block.kind:
            continue
        code = block.code.replace(DOC_TARGET, target).replace(DOC_HTTP, server.http_target)
        t0 = time.monotonic()
        if block.kind == "python":
            script = tmp_path / f"block_{block.line}.py"
            script.write_text(code)
            cmd, cwd = [str(PYTHON), str(script)], tmp_path
        else:
            script = tmp_path / f"block_{block.line}.sh"
            script.write_text(snippets.bash_script(code, state))
            cmd, cwd = ["bash", str(script)], REPO
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
        print(
            f"\n{_name(doc)}:{block.line} ({block.lang}, {DOC_TARGET} -> {target}): "
            f"exit {p.returncode} in {time.monotonic() - t0:.1f} s"
        )
        assert p.returncode == 0, (
            f"{_name(doc)}:{block.line}: the {block.lang} block exited {p.returncode}\n"
            f"--- the block\n{block.code}--- stdout\n{p.stdout[-3000:]}\n"
            f"--- stderr\n{p.stderr[-3000:]}"
        )
