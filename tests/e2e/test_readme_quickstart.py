"""The README's local quick start runs as written, and writes what the README says it writes.

The commands are read from the README's "Local quick start" section (tests/markdown_commands.py).
``make demo`` runs with ``DEMO_ARGS`` naming a smaller run (one iteration of 2 × 2 short
episodes instead of the embedded default's warm start and six iterations), so the check costs a
minute or two rather than the demo's few minutes: the command, the Makefile target, the launcher
and the run directory's files are the ones a reader gets. The other ``aflowrl`` lines of the
section run as they are, in a scratch directory; ``aflowrl train`` itself is what ``make demo``
just ran (its flags are checked against the parser by tests/unit/test_docs.py).
tests/e2e/test_train_e2e.py covers training's faults and resumption; this file only the README.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from markdown_commands import ROOT, entry_point_argv, shell_commands

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

SECTION = "Local quick start"

SHORT_RUN = """\
policy: {dtype: float32}
learner:
  fsdp: {mixedPrecision: none}
  loss: {miniBatchSize: 4, microBatchSize: 4}
environment:
  benchmarks: [math]
  executor: {type: surrogate}
  replicas: {min: 1, max: 1}
  evaluation: {maxProblems: 4, repeats: 1}
  search: {maxSteps: 2, maxAdmissibleActions: 6, maxObservationChars: 1500}
trainer: {iterations: 1, tasksPerIteration: 2, groupSize: 2, checkpointEvery: 1}
"""
"""A run of the same shape as the embedded default, small enough for the test suite."""

WRITTEN = ("spec.yaml", "metrics.jsonl", "curves.png", "best", "final.md", "logs", "checkpoints")
"""What the README says the run directory holds."""


def _readme_commands() -> list[str]:
    return [c.text for c in shell_commands(ROOT / "README.md", section=SECTION)]


def test_the_readme_quick_start_names_the_demo_and_what_it_writes():
    commands = _readme_commands()
    assert commands and commands[0] == "make demo", commands
    section = (ROOT / "README.md").read_text().split(f"## {SECTION}", 1)[1].split("\n## ", 1)[0]
    for name in WRITTEN:
        assert f"`{name}" in section, f"the quick start no longer says it writes {name}"


def test_the_readme_local_quick_start_runs_as_written(tmp_path, aflow_data):
    spec = tmp_path / "short-run.yaml"
    spec.write_text(SHORT_RUN)
    run_dir = tmp_path / "run"
    venv = Path(sys.prefix)
    # `make demo` first runs `aflowrl data download`; with every file already in the data
    # directory and verified it downloads nothing, so the test needs no network.
    env = {**os.environ, "AFLOWRL_LOG_LEVEL": "WARNING", "AFLOWRL_DATA_DIR": str(aflow_data)}
    for command in _readme_commands():
        if command == "make demo":
            demo_args = f"-f {spec} --run-dir {run_dir} --no-progress"
            argv = ["make", "demo", f"VENV={venv}", f"DEMO_ARGS={demo_args}"]
            done = subprocess.run(
                argv, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500
            )
            assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
            assert f"run directory {run_dir}" in done.stdout + done.stderr
            assert f"already in {aflow_data}, verified" in done.stdout + done.stderr
            missing = [name for name in WRITTEN if not (run_dir / name).exists()]
            assert not missing, f"make demo did not write {missing} in {run_dir}"
            assert (run_dir / "metrics.jsonl").read_text().count("\n") == 1
            assert re.search(r"\bseed\b", (run_dir / "final.md").read_text())
            continue
        parsed = entry_point_argv(command)
        assert parsed is not None, (
            f"the quick start shows a command this test cannot run: {command}"
        )
        program, argv = parsed
        if argv[:1] == ["train"]:
            continue  # what `make demo` ran above
        redirect = shlex.split(command.partition(">")[2]) if ">" in command else []
        done = subprocess.run(
            [str(venv / "bin" / program), *argv],
            check=False,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, (command, done.stderr[-3000:])
        if redirect:
            (tmp_path / redirect[0]).write_text(done.stdout)
