"""Comments and docs name modules that exist: a file named in our code or
docs as `name.py` or `dir/name.py` is a file of the repository (a rename that
left its old name behind in a comment fails here). Paths into other projects
(vllm/..., asyncio/...) are not ours and not checked; the few bare names of
other projects' modules are listed in EXTERNAL."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Where our comments and docs are.
ROOTS = ("rollout_service/", "client/rollout_client/", "harness/", "benchmarks/", "docs/", "tests/")
ROOT_FILES = ("README.md", "BENCHMARKS.md", "examples/agent_loop.py", "examples/grpo_loop.py")
# Other projects' module files named bare (TRL's trainer, the standard
# library, a test of verl's) or by a path that starts like one of ours.
EXTERNAL = {
    "grpo_trainer.py",
    "selectors.py",
    "threading.py",
    "test_global_steps_on_cpu.py",
    "tests/checkpoint_engine/test_global_steps_on_cpu.py",
}
# Other projects' roots that are also names of our folders (rollout_client/verl).
EXTERNAL_ROOTS = {"verl"}
# Names that tests write into files of their own (tests/repo/test_layout.py, test_orphans.py,
# test_companion.py).
WRITTEN_BY_TESTS = {
    "x.py",
    "record.py",
    "test_a_first.py",
    "test_b_second.py",
    "test_c_engine.py",
    "test_a.py",
    "test_c.py",
    "middle.py",
    "tests/test_a.py",
    "tests/support/x.py",
    "tests/unit/test_c.py",
}
# A record of the past: it names modules as they were then.
HISTORY = {"docs/bench/history.md", "tests/repo/test_module_names.py"}
NAMED = re.compile(r"(?<![\w/.-])((?:[A-Za-z_][\w-]*/)*[A-Za-z_]\w*\.py)\b")


class Tree:
    """The repository's files, indexed once for `unknown`'s lookups."""

    def __init__(self, files: list[str]) -> None:
        self.files = set(files)
        self.basenames = {Path(f).name for f in files}
        dirs = {p for f in files for p in map(str, Path(f).parents)} - {"."}
        self.dir_names = {Path(d).name for d in dirs}
        # Every tail of a path after one of its slashes ("b/c.py" of "a/b/c.py").
        self.tails = {f.split("/", i)[i] for f in files for i in range(1, f.count("/") + 1)}


def _tree() -> Tree:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    return Tree(out.stdout.split())


def unknown(text: str, where: str, tree: Tree) -> list[str]:
    """The module files `text` (from the file `where`) names that do not exist."""
    here = Path(where).parent
    found = []
    for ref in NAMED.findall(text):
        parts = ref.split("/")
        if ref in EXTERNAL:
            ok = True
        elif len(parts) == 1:
            ok = ref in tree.basenames or ref in WRITTEN_BY_TESTS
        elif parts[0] not in tree.dir_names or parts[0] in EXTERNAL_ROOTS:
            ok = True  # another project's path (vllm/..., asyncio/...)
        else:
            candidates = [Path(ref), here / ref, Path("rollout_service") / ref]
            candidates += [Path("client/rollout_client") / ref, Path("client") / ref]
            ok = any(str(c) in tree.files for c in candidates) or ref in WRITTEN_BY_TESTS
            ok = ok or ref in tree.tails
        if not ok:
            found.append(f"{where}: {ref}")
    return found


def test_every_module_our_comments_and_docs_name_exists():
    tree = _tree()
    found = []
    for f in sorted(tree.files):
        ours = (f.startswith(ROOTS) or f in ROOT_FILES) and f not in HISTORY
        if ours and f.endswith((".py", ".md")):
            found += unknown((REPO / f).read_text(errors="ignore"), f, tree)
    assert not found, "named but not in the repository:\n" + "\n".join(sorted(set(found)))


def test_a_stale_name_is_caught():
    tree = _tree()
    where = "rollout_service/rpc/update_rpcs.py"
    assert unknown("Receiving is update_sessions.py's", where, tree) == [
        f"{where}: update_sessions.py"
    ]
    assert unknown("Receiving is update/transfers.py's", where, tree) == []
    assert unknown("see rollout_service/updates.py", where, tree)
    assert unknown("vllm/v1/engine/async_llm.py", where, tree) == []
