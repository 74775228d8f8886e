"""The sandbox starts wherever the project is installed, and says why when it cannot.

A virtual environment in a ``mktemp -d`` directory (mode 0700, under the /tmp that bubblewrap
replaces with a private one) whose path holds a space: the sandbox binds it explicitly, runs
code with it, scores a verdict with it (the answer process starts from it too), survives runs
that attack the bind, and cleans up between runs. A sandbox that bubblewrap can run but that is
broken (an interpreter that fails inside, one the sandbox's user cannot read) is an error with
the reason, also in ``auto`` mode, never a silent fall back to weaker isolation.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from aflowrl import sandbox
from aflowrl.benchmarks.base import Problem
from aflowrl.benchmarks.humaneval import HumanEval
from aflowrl.sandbox import SandboxPool, SandboxUnavailableError

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bubblewrap installed")

ADD = Problem(
    "humaneval",
    "x/add",
    "",
    "def check(candidate):\n    assert candidate(2, 3) == 5\n",
    {"entry_point": "add"},
)


@pytest.fixture(scope="module")
def private_venv() -> Iterator[Path]:
    """A virtual environment (this interpreter's base, no packages) in a fresh ``mktemp -d``
    directory, mode 0700, under a directory whose name has a space."""
    top = Path(tempfile.mkdtemp())  # what `mktemp -d` makes: 0700, in /tmp
    assert stat.S_IMODE(top.stat().st_mode) == 0o700
    home = top / "a checkout" / ".venv"
    venv.create(home, with_pip=False, symlinks=True)
    yield home
    shutil.rmtree(top)


@pytest.fixture(scope="module", params=[pytest.param("bwrap", marks=needs_bwrap), "rlimits"])
def venv_pool(request: pytest.FixtureRequest, private_venv: Path) -> Iterator[SandboxPool]:
    with SandboxPool(1, mode=request.param, python=str(private_venv / "bin" / "python")) as pool:
        yield pool


def test_code_runs_with_the_interpreter_of_a_private_directory(venv_pool, private_venv):
    result = venv_pool.run("import sys; print(sys.prefix)")
    assert result.ok, result.stderr
    assert result.stdout.strip() == str(private_venv)
    if venv_pool.mode == "bwrap":
        assert "private_filesystem" in venv_pool.protections


def test_runs_from_there_are_cleaned_up_and_keep_the_interpreter(venv_pool, private_venv):
    attack = """
        import os, shutil
        open(os.path.join(os.environ["TMPDIR"], "left-behind"), "w").write("x")
        """
    if venv_pool.mode == "bwrap":  # (the rlimits fallback has no private filesystem to defend)
        top = private_venv.parent.parent
        attack += f"""
        for path in ({str(top)!r}, {str(private_venv)!r}):
            for act in (lambda: shutil.rmtree(path), lambda: os.rename(path, path + "-moved")):
                try:
                    act()
                except OSError:
                    pass
        """
    venv_pool.run(textwrap.dedent(attack))
    after = venv_pool.run(
        "import os, sys; print(sys.prefix); print(os.listdir(os.environ['TMPDIR']))"
    )
    assert after.ok, after.stderr
    assert after.stdout.splitlines() == [str(private_venv), "['main.py']"]  # its own only


async def test_a_verdict_is_scored_with_that_interpreter(venv_pool):
    async def run(code: str, **kwargs: object) -> sandbox.SandboxResult:
        return await sandbox.arun_python(code, pool=venv_pool, **kwargs)  # type: ignore[arg-type]

    scorer = HumanEval(runner=run)
    assert (await scorer.score(ADD, "def add(a, b):\n    return a + b\n")).value == 1.0
    assert (await scorer.score(ADD, "def add(a, b):\n    return a - b\n")).value == 0.0


def _wrapper(directory: Path, inside: str) -> str:
    """A "python" that is this interpreter outside the sandbox and runs ``inside`` (shell)
    within it (bubblewrap names the sandbox's host "sandbox")."""
    script = directory / "python"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$(cat /proc/sys/kernel/hostname)" = sandbox ]; then\n'
        f"{inside}\n"
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


@needs_bwrap
@pytest.mark.parametrize("mode", ["auto", "bwrap"])
def test_a_broken_sandbox_is_an_error_with_the_reason_not_a_fallback(tmp_path, mode):
    python = _wrapper(tmp_path, "  echo 'the interpreter is broken in here' >&2; exit 3")
    with pytest.raises(SandboxUnavailableError) as caught:
        SandboxPool(1, mode=mode, python=python).start()
    message = str(caught.value)
    assert "the interpreter is broken in here" in message
    if mode == "auto":
        assert "bubblewrap runs here, but the sandbox worker does not start" in message


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="only root drops to a uid that cannot read")
def test_an_interpreter_the_sandbox_user_cannot_read_is_named(tmp_path):
    home = tmp_path / "secret venv"
    venv.create(home, with_pip=False, symlinks=True)
    home.chmod(0o700)
    with pytest.raises(SandboxUnavailableError) as caught:
        SandboxPool(1, mode="auto", python=str(home / "bin" / "python")).start()
    assert f"cannot read the interpreter's directory {home} (mode 0700)" in str(caught.value)


def test_a_fresh_process_starts_its_default_pool_from_there(tmp_path):
    """What a service does at start-up (mode from $AFLOWRL_SANDBOX, default ``auto``), in a
    child process whose interpreter lives in a 0700 directory with a space."""
    top = Path(tempfile.mkdtemp(dir=tmp_path))
    home = top / "with space" / "venv"
    venv.create(home, with_pip=False, symlinks=True)
    code = (
        "from aflowrl.sandbox import SandboxPool\n"
        f"with SandboxPool(1, python={str(home / 'bin' / 'python')!r}) as pool:\n"
        "    result = pool.run('import sys; print(sys.prefix)')\n"
        "    print(pool.mode, result.status, result.stdout.strip(), sep='\\n')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    mode = "bwrap" if shutil.which("bwrap") else "rlimits"
    assert done.stdout.splitlines() == [mode, "ok", str(home)], done.stderr
