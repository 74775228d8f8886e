"""Reading the shell commands that README.md and docs/ show, for the tests that check them.

Used by tests/unit/test_docs.py (every ``aflowrl`` command line parses with the real argparse
parser) and tests/e2e/test_readme_quickstart.py (the README's local quick start runs as written).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SHELL_LANGUAGES = frozenset({"bash", "sh", "shell", "console"})
"""Fence languages whose blocks hold shell commands."""

_FENCE = re.compile(r"^(```+|~~~+)\s*([A-Za-z0-9_-]*)")
_OPERATORS = frozenset({"|", "||", "&&", ";", ">", ">>", "<", "2>&1", "&"})
_ENTRY_POINTS = {"aflowrl", "aflowrl-operator"}


@dataclass(frozen=True)
class Command:
    """One command line of a shell code block (continuations joined, comments dropped)."""

    path: Path
    line: int
    """1-based line of the command's first line in the file."""
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def code_blocks(text: str, *, section: str | None = None) -> list[tuple[int, str, str]]:
    """``(first line, language, body)`` of every fenced block, or only those under the heading
    ``section`` (up to the next heading of the same or a higher level)."""
    blocks: list[tuple[int, str, str]] = []
    lines = text.splitlines()
    level: int | None = None
    inside = section is None
    fence: str | None = None
    language = ""
    body: list[str] = []
    start = 0
    for number, line in enumerate(lines, start=1):
        if fence is None:
            heading = re.match(r"^(#+)\s+(.*?)\s*$", line)
            if heading and section is not None:
                depth = len(heading.group(1))
                if heading.group(2) == section:
                    inside, level = True, depth
                elif level is not None and depth <= level:
                    inside = False
            match = _FENCE.match(line)
            if match:
                fence, language, body, start = match.group(1), match.group(2).lower(), [], number
            continue
        if line.strip().startswith(fence):
            if inside:
                blocks.append((start + 1, language, "\n".join(body)))
            fence = None
            continue
        body.append(line)
    return blocks


def shell_commands(path: Path, *, section: str | None = None) -> list[Command]:
    """Every command line of the shell blocks of a Markdown file."""
    found: list[Command] = []
    for first, language, body in code_blocks(path.read_text(), section=section):
        if language not in SHELL_LANGUAGES:
            continue
        pending: list[str] = []
        start = first
        for offset, raw in enumerate(body.splitlines()):
            line = raw.rstrip()
            if not pending:
                start = first + offset
                line = line.removeprefix("$ ")
            if line.endswith("\\"):
                pending.append(line[:-1])
                continue
            pending.append(line)
            text = " ".join(part.strip() for part in pending).strip()
            pending = []
            if text and not text.startswith("#"):
                found.append(Command(path, start, text))
    return found


def entry_point_argv(command: str) -> tuple[str, list[str]] | None:
    """``(entry point, arguments)`` of a command line that runs ``aflowrl`` or
    ``aflowrl-operator`` (directly, from a virtualenv's bin/, or as ``torchrun ... -m aflowrl``),
    up to the first shell operator; None for any other command. Optional parts written as
    ``[--flag VALUE]`` are kept, without the brackets."""
    tokens = shlex.split(command, comments=True)
    for index, token in enumerate(tokens):
        if token in _OPERATORS:
            tokens = tokens[:index]
            break
    program = None
    for index, token in enumerate(tokens):
        name = Path(token).name
        if name in _ENTRY_POINTS and (index == 0 or tokens[index - 1] == "-m"):
            program, rest = name, tokens[index + 1 :]
            break
    if program is None:
        return None
    argv = [token.removeprefix("[").removesuffix("]") for token in rest]
    return program, [token for token in argv if token]


def documentation_files() -> list[Path]:
    """README.md and every hand-written page under docs/ (the generated reference pages quote
    usage lines, not commands)."""
    pages = sorted(p for p in (ROOT / "docs").rglob("*.md") if "reference" not in p.parts)
    return [ROOT / "README.md", *pages]
