"""Child processes of a local run: health-checked start, clean stops, nothing left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from aflowrl.local.errors import ServiceStartError
from aflowrl.local.processes import ProcessGroup, free_ports

CHILD = Path(__file__).with_name("health_child.py")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its adoptive parent) counts as gone.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def _describe(pid: int, child: int, grandchild: int) -> str:
    """Which process is left, in what state, with what parent (for a failure's message)."""
    role = {child: "child", grandchild: "grandchild"}.get(pid, "?")
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return f"{role} {pid}: gone"
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    keep = ("State", "PPid", "SigBlk", "SigIgn", "SigCgt")
    return f"{role} {pid}: " + ", ".join(f"{k}={fields.get(k, '').strip()}" for k in keep)


def _wait_gone(pids: list[int], timeout: float = 120.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def _start(group: ProcessGroup, name: str, tmp_path: Path, *flags: str):
    port = free_ports(1)[0]
    pidfile = tmp_path / f"{name}.pid"
    command = [sys.executable, str(CHILD), str(port), str(pidfile), *flags]
    return group.start(name, command, port), pidfile


def _grandchild(pidfile: Path) -> int:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if pidfile.is_file() and pidfile.read_text().strip():
            return int(pidfile.read_text())
        time.sleep(0.05)
    raise AssertionError(f"{pidfile} never written")


def test_free_ports_are_distinct():
    ports = free_ports(8)
    assert len(set(ports)) == 8


async def test_children_serve_then_stop_with_everything_they_started(tmp_path):
    with ProcessGroup(tmp_path / "logs", grace_s=10.0) as group:
        polite, polite_pids = _start(group, "polite", tmp_path)
        leaky, leaky_pids = _start(group, "leaky", tmp_path, "--leak")
        await group.wait_serving(60.0)
        pids = [polite.pid, leaky.pid, _grandchild(polite_pids), _grandchild(leaky_pids)]
        assert all(_alive(p) for p in pids)
        assert os.getpgid(leaky.pid) == leaky.pid != os.getpgrp()  # a session of its own
    assert polite.process.returncode == 0 and leaky.process.returncode == 0
    assert _wait_gone(pids) == []  # the leaked sleep went with its group
    assert (tmp_path / "logs" / "polite.log").is_file()


async def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    group = ProcessGroup(tmp_path / "logs", grace_s=1.0)
    stubborn, pidfile = _start(group, "stubborn", tmp_path, "--ignore-term", "--leak")
    await group.wait_serving(60.0)
    grandchild = _grandchild(pidfile)
    started = time.monotonic()
    assert group.stop(stubborn) == -signal.SIGKILL
    assert time.monotonic() - started < 10
    assert _wait_gone([stubborn.pid, grandchild]) == []


async def test_a_child_that_dies_while_starting_fails_the_start_with_its_log(tmp_path):
    with ProcessGroup(tmp_path / "logs", grace_s=1.0) as group:
        _start(group, "broken", tmp_path, "--exit-at-once")
        with pytest.raises(ServiceStartError) as info:
            await group.wait_serving(60.0)
    text = str(info.value)
    assert "broken exited with status 3" in text and "model directory is missing" in text


async def test_a_child_that_never_serves_times_out_naming_it(tmp_path):
    with ProcessGroup(tmp_path / "logs", grace_s=1.0) as group:
        port = free_ports(1)[0]
        group.start("mute", [sys.executable, "-c", "import time; time.sleep(60)"], port)
        with pytest.raises(ServiceStartError, match=r"mute was not serving after 1s"):
            await group.wait_serving(1.0)


LAUNCHER = """
import asyncio, signal, sys, time
if {blocked!r}:  # what a caller may hand down: SIGTERM blocked and ignored
    signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGTERM}})
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
sys.path.insert(0, {tests!r})
from pathlib import Path
from aflowrl.local.processes import ProcessGroup, free_ports

group = ProcessGroup(Path({logs!r}))
port = free_ports(1)[0]
child = group.start("svc", [sys.executable, {child!r}, str(port), {pidfile!r}], port)
asyncio.run(group.wait_serving(60))
print(child.pid, flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("blocked", [False, True], ids=["plain", "sigterm-blocked-by-caller"])
def test_children_die_with_a_launcher_killed_outright(tmp_path, blocked):
    """SIGKILL gives the launcher no chance to clean up: the orphan guard does it."""
    pidfile = tmp_path / "svc.pid"
    script = LAUNCHER.format(
        tests=str(CHILD.parent),
        logs=str(tmp_path / "logs"),
        child=str(CHILD),
        pidfile=str(pidfile),
        blocked=blocked,
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert launcher.stdout is not None
        child_pid = int(launcher.stdout.readline())
        grandchild = _grandchild(pidfile)
        assert _alive(child_pid) and _alive(grandchild)
        launcher.kill()
        launcher.wait(10)
        left = _wait_gone([child_pid, grandchild])
        assert left == [], [_describe(p, child_pid, grandchild) for p in left]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(10)
        if launcher.stdout is not None:
            launcher.stdout.close()
