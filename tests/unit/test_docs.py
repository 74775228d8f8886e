"""The documentation: generated reference pages are current, the site builds with --strict, and
every ``aflowrl`` command the README and the docs show parses with the real parser.

The reference pages come from docs/gen_reference.py (``make docs``); a page that differs from a
fresh run is stale. The MkDocs build runs as ``make test`` runs it, into a temporary directory.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from markdown_commands import documentation_files, entry_point_argv, shell_commands

ROOT = Path(__file__).resolve().parents[2]


def _load_generator():
    spec = importlib.util.spec_from_file_location(
        "gen_reference", ROOT / "docs" / "gen_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_reference_pages_are_not_stale():
    generator = _load_generator()
    fresh = generator.generate()
    committed = generator.OUT
    stale = [
        name
        for name, text in fresh.items()
        if not (committed / name).is_file() or (committed / name).read_text() != text
    ]
    assert not stale, f"stale docs/reference pages (run `make docs` and commit): {stale}"


def test_every_condition_reason_documented_is_one_the_operator_sets():
    generator = _load_generator()
    source = "\n".join(p.read_text() for p in (ROOT / "operator").rglob("*.py"))
    unknown = [reason for reason in generator.REASON_MEANING if f'"{reason}"' not in source]
    assert not unknown, f"documented reasons the operator never sets: {unknown}"


def test_a_reason_the_operator_adds_without_documentation_stops_the_generator(monkeypatch):
    generator = _load_generator()
    monkeypatch.delitem(generator.REASON_MEANING, "Unschedulable")
    with pytest.raises(SystemExit, match="Unschedulable"):
        generator.conditions_page()


def test_the_site_builds_with_strict_checks(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()


def _parsers():
    from aflowrl.cli import build_parser
    from aflowrl_operator.cli import build_parser as operator_parser

    return {"aflowrl": build_parser(), "aflowrl-operator": operator_parser()}


def _documented_commands():
    found = []
    for path in documentation_files():
        for command in shell_commands(path):
            parsed = entry_point_argv(command.text)
            if parsed is not None:
                found.append((command, *parsed))
    return found


def test_the_extractor_finds_the_commands_the_readme_and_the_docs_show():
    commands = _documented_commands()
    shown = {" ".join([program, *argv[:2]]) for _, program, argv in commands}
    assert {"aflowrl spec default", "aflowrl train -f", "aflowrl eval --workflow"} <= shown
    assert len(commands) >= 20


def test_every_aflowrl_command_in_the_readme_and_the_docs_parses():
    parsers = _parsers()
    refused = []
    for command, program, argv in _documented_commands():
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
                parsers[program].parse_args(argv)
        except SystemExit as exc:
            if exc.code not in (0, None):
                last = errors.getvalue().strip().splitlines()[-1:]
                refused.append(f"{command.where}: {command.text}\n    {' '.join(last)}")
    assert not refused, "commands the CLI refuses:\n" + "\n".join(refused)


def test_a_command_the_cli_refuses_is_reported(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# t\n\n```bash\naflowrl model init --preset small DIR\n```\n")
    (command,) = shell_commands(page)
    program, argv = entry_point_argv(command.text)
    with pytest.raises(SystemExit) as exc, contextlib.redirect_stderr(io.StringIO()):
        _parsers()[program].parse_args(argv)
    assert exc.value.code == 2
