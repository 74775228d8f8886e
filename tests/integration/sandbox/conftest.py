"""Sandbox pools for the integration tests, one per isolation mode this machine runs.

``pool`` is parametrised over ``bwrap`` (skipped only where bubblewrap is not installed: one
that is installed but cannot start fails the tests, with the reason) and ``rlimits``
(the fallback; as root it gets a world-readable interpreter where there is one, so that the code
can run under a reserved uid). ``strays`` finds what a run may have left on the host: processes
whose command line carries a marker, and processes of sandbox uids no live worker holds.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from aflowrl.sandbox import SandboxPool, SandboxUnavailableError, _launch, _zygote

SECRET_NAME = "AFLOWRL_SANDBOX_TEST_SECRET"
SECRET = f"secret-{uuid.uuid4().hex}"


def world_accessible(path: str) -> bool:
    """Whether a user with no relation to the owner can reach ``path`` (and read it)."""
    path = os.path.realpath(path)
    parts = Path(path).parents
    for parent in parts:
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
    return bool(os.stat(path).st_mode & stat.S_IROTH)


def world_python(minimum: tuple[int, int] = (3, 10)) -> str | None:
    """An interpreter (this one if it can be) that any user can run, or None."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate) and world_accessible(candidate):
            probe = subprocess.run(
                [candidate, "-c", f"import sys; print(sys.version_info >= {minimum})"],
                capture_output=True,
                text=True,
                check=False,
            )
            if probe.stdout.strip() == "True":
                return candidate
    return None


@pytest.fixture(scope="module", params=["bwrap", "rlimits"])
def pool(request: pytest.FixtureRequest) -> Iterator[SandboxPool]:
    mode = request.param
    python = sys.executable
    if mode == "rlimits" and os.geteuid() == 0:  # so that the code can run as a reserved uid
        python = world_python() or sys.executable
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SECRET_NAME, SECRET)  # in the caller's environment while workers start
        if mode == "bwrap" and shutil.which("bwrap") is None:
            pytest.skip("bubblewrap is not installed (Debian package: bubblewrap)")
        try:
            started = SandboxPool(2, mode=mode, python=python).start()
        except SandboxUnavailableError as exc:  # installed but not working: that is a failure
            pytest.fail(f"the {mode} sandbox cannot start: {exc}", pytrace=False)
        with started:
            yield started


@pytest.fixture(name="world_accessible")
def world_accessible_fixture() -> object:
    """:func:`world_accessible`, for tests."""
    return world_accessible


@pytest.fixture(name="world_python")
def world_python_fixture() -> object:
    """:func:`world_python`, for tests."""
    return world_python


@pytest.fixture
def secret() -> tuple[str, str]:
    """Name and value of the secret in the caller's environment while the pools start."""
    return SECRET_NAME, SECRET


@pytest.fixture(scope="module")
def secret_holder() -> Iterator[int]:
    """A process of the caller's user with the secret in its environment (like a service pod)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        env={**os.environ, SECRET_NAME: SECRET},
    )
    yield proc.pid
    proc.kill()
    proc.wait()


def _processes() -> Iterator[tuple[int, int, bytes]]:
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        status = _zygote.process_status(name)
        if status is None or status[1] in "ZX":
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        yield int(name), status[0], cmdline


def _uid_is_leased(uid: int) -> bool:
    for lock_dir in (Path("/run/aflowrl-sandbox"), Path("/tmp/aflowrl-sandbox-uids")):
        lock = lock_dir / f"{uid}.lock"
        if not lock.exists():
            continue
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
    return False


def find_strays(marker: str) -> list[str]:
    """Processes left behind: the marker in their command line, or an unheld sandbox uid."""
    found = []
    for pid, uid, cmdline in _processes():
        if marker.encode() in cmdline:
            found.append(f"{pid} (marker) {cmdline[:80]!r}")
        elif _launch.UID_BASE <= uid < _launch.UID_BASE + 4096 and not _uid_is_leased(uid):
            found.append(f"{pid} (uid {uid}, no worker) {cmdline[:80]!r}")
    return found


@pytest.fixture
def strays() -> object:
    """``strays(marker)``: what is still running after a bounded wait for cleanup."""

    def check(marker: str, wait_s: float = 5.0) -> list[str]:
        give_up = time.monotonic() + wait_s
        while True:
            found = find_strays(marker)
            if not found or time.monotonic() > give_up:
                return found
            time.sleep(0.05)

    return check
