"""The code blocks of the README and docs/*.md, each with the marker that may
say it is not run here, and each shell block as the bash script that runs it
(tests/engine/docs/test_snippets.py runs them against a server).

A block is a fenced block: a line of three backticks and a language, the code,
a line of three backticks. The line before the opening fence may hold a marker,
an HTML comment that the rendered page does not show:

    <!-- snippet: skip (needs a GPU) -->
        not run here, for the reason in brackets;
    <!-- snippet: setup (scripts/setup --dev installs it) -->
        installs or builds something: not run here (no test installs
        packages), the reason says what in the suite's own setup covers it.

Blocks in python, sh, bash, shell or console run unless marked; `text` blocks
(trees, drawings) are prose. A block in any other language, or in none, must
be marked, and a marker needs a reason and a block right after it: a new
document's blocks cannot go untested silently (`problems`).

A shell block whose lines start with `$ ` is a session: the `$ ` lines (and
the lines a trailing backslash continues) are its commands, the others show
their output. Each command runs in turn and must succeed, except one whose
output the document shows as an error (`{ "code": "invalid_argument", ...`),
which must fail with that code.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

RUNNABLE = {"python": "python", "sh": "sh", "bash": "sh", "shell": "sh", "console": "sh"}
PROSE = {"text"}
KINDS = {"skip", "setup"}

_FENCE = re.compile(r"^ {0,3}```\s*([\w+-]*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*snippet:\s*(\w+)\s*(?:\((.*)\))?\s*-->\s*$")
_SHOWN_ERROR = re.compile(r'^\{\s*"code":\s*"(\w+)"')
# Variables bash makes itself: not the blocks' state.
_BASH_OWN = re.compile(r"^(__.*|BASH.*|PIPESTATUS|FUNCNAME|COMP_.*|_)$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language and code, and its marker."""

    doc: Path
    line: int  # the opening fence's line, from 1
    lang: str  # "" when the fence names none
    code: str
    mark: str | None = None  # "skip", "setup", or an unknown word (a problem)
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.doc.name}:{self.line}"

    @property
    def kind(self) -> str | None:
        """ "python" or "sh" for a block that runs here, else None."""
        return RUNNABLE.get(self.lang) if self.mark is None else None


def blocks(doc: Path) -> list[Block]:
    """Every fenced block of `doc`, in order, with its marker."""
    lines = doc.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{doc.name}:{i + 1}: a fence that is never closed")
        marker = _MARKER.match(lines[i - 1]) if i else None
        mark, reason = (marker.group(1), (marker.group(2) or "").strip()) if marker else (None, "")
        code = "\n".join(lines[i + 1 : end]) + "\n"
        out.append(Block(doc, i + 1, opening.group(1), code, mark, reason))
        i = end + 1
    return out


def problems(doc: Path) -> list[str]:
    """What is wrong with `doc`'s blocks and markers: a block not run here
    and not marked, a marker of an unknown kind or without a reason, a
    marker with no fence after it."""
    return [p for b in blocks(doc) for p in _problems(b)] + _stray_markers(doc)


def _problems(b: Block) -> list[str]:
    if b.mark is None:
        if b.lang in RUNNABLE or b.lang in PROSE:
            return []
        return [
            f"{b.where}: a ```{b.lang or '(no language)'} block, not run here and not marked: "
            "put `<!-- snippet: skip (why) -->` on the line before its fence, or make it "
            f"one of {sorted(RUNNABLE)} (run) or `text` (prose)"
        ]
    if b.mark not in KINDS:
        return [f"{b.where}: unknown marker `{b.mark}` (one of {sorted(KINDS)})"]
    if not b.reason:
        return [f"{b.where}: the `{b.mark}` marker gives no reason in brackets"]
    return []


def _stray_markers(doc: Path) -> list[str]:
    lines = doc.read_text().splitlines()
    return [
        f"{doc.name}:{n + 1}: a snippet marker with no fence on the next line"
        for n, line in enumerate(lines)
        if _MARKER.match(line) and not (n + 1 < len(lines) and _FENCE.match(lines[n + 1]))
    ]


@dataclass(frozen=True)
class Command:
    """One command of a session block, and the error the document shows it
    answering with ("" when it shows none)."""

    line: int  # of its `$ `, from the block's first line of code (1)
    text: str
    shown_error: str


def session(code: str) -> list[Command] | None:
    """The commands of a `$ `-prompted block, or None for a plain script."""
    lines = code.splitlines()
    if not any(line.startswith("$ ") for line in lines):
        return None
    found: list[tuple[int, list[str], list[str]]] = []  # line, command lines, output
    for n, line in enumerate(lines, 1):
        if found and found[-1][1][-1].endswith("\\"):
            found[-1][1].append(line)
        elif line.startswith("$ "):
            found.append((n, [line[2:]], []))
        elif found:
            found[-1][2].append(line)
    commands = []
    for n, text, output in found:
        shown = _SHOWN_ERROR.match("\n".join(output).strip())
        commands.append(Command(n, "\n".join(text), shown.group(1) if shown else ""))
    return commands


def bash_script(code: str, state: Path) -> str:
    """The shell block `code` as a bash script that starts from the variables
    the file's earlier shell blocks set (kept in `state`) and saves its own
    there: a session command by command, each checked; a plain script under
    `set -euo pipefail`."""
    saved = shlex.quote(str(state))
    # The variables this process has that a bare bash has not: the blocks'.
    keep = (
        f'for __v in $(compgen -v); do [[ "$__v" =~ {_BASH_OWN.pattern} ]] || '
        f'grep -qxF "$__v" <<<"$__names" || declare -p "$__v"; done > {saved}'
    )
    head = f'__names="$(compgen -v)"\n[[ -f {saved} ]] && source {saved}\n'
    commands = session(code)
    if commands is None:
        return f"{head}set -euo pipefail\n{code}\nset +eu\n{keep}\n"
    body = []
    for c in commands:
        where = shlex.quote(f"line {c.line}: {c.text.splitlines()[0]}")
        if c.shown_error:
            # The document shows an error: it must fail, and say so.
            body.append(
                f"__out=$( {{ {c.text}\n}} 2>&1 ); __rc=$?; printf '%s\\n' \"$__out\"\n"
                f'if (( __rc == 0 )) || ! grep -q {shlex.quote(c.shown_error)} <<<"$__out"; then '
                f"echo {where}: expected to fail with {c.shown_error} >&2; exit 1; fi"
            )
        else:
            body.append(
                f"{c.text}\n__rc=$?; if (( __rc != 0 )); then "
                f'echo {where}: exited "$__rc" >&2; exit 1; fi'
            )
    return head + "set -u -o pipefail\n" + "\n".join(body) + f"\nset +u\n{keep}\n"
