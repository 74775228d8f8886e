"""The sandbox started by a non-root caller, as in a pod: bwrap in a user namespace, and the
rlimits fallback under the caller's own uid.

Needs root (to become another user) and an interpreter that user can run; skipped otherwise. A
checkout that user cannot read (a clone in a ``mktemp -d`` directory) is staged as a readable
copy of the package. The caller holds a secret in its initial environment, which code of its own
uid could read through /proc if the caller were dumpable.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

SERVICES = Path(__file__).resolve().parents[3] / "services"
NOBODY = 65534

_CALLER = """
import json, os, sys
sys.path.insert(0, {services!r})
from aflowrl.sandbox import SandboxLimits, SandboxPool

CODE = '''
import os
me = {{'uid': os.getuid()}}
try:
    me['caller_env'] = open('/proc/%d/environ', 'rb').read().decode(errors='replace')
except OSError as exc:
    me['caller_env'] = exc.strerror
print(repr(me))
''' % os.getpid()
report = {{}}
for mode in ('auto', 'rlimits'):
    with SandboxPool(1, mode=mode) as pool:
        result = pool.run(CODE, limits=SandboxLimits(timeout_s=20))
        loop = pool.run('while True: pass', limits=SandboxLimits(timeout_s=0.3))
        report[mode] = {{'mode': pool.mode, 'protections': list(pool.protections),
            'status': result.status, 'stdout': result.stdout, 'stderr': result.stderr,
            'loop': loop.status}}
print(json.dumps(report))
"""


@pytest.fixture
def readable_services(world_accessible) -> Iterator[Path]:
    """The checkout's ``services`` when anyone can read it; else (a clone in a ``mktemp -d``
    directory, mode 0700) a world-readable copy of its ``aflowrl`` package under /tmp."""
    if world_accessible(str(SERVICES / "aflowrl" / "sandbox" / "pool.py")):
        yield SERVICES
        return
    staged = Path(tempfile.mkdtemp(prefix="aflowrl-services-", dir="/tmp"))
    try:
        shutil.copytree(
            SERVICES / "aflowrl",
            staged / "aflowrl",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        for path in [staged, *staged.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield staged
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def test_a_non_root_caller_gets_a_user_namespace_or_a_hardened_fallback(
    world_python, readable_services
):
    python = world_python((3, 11))
    if os.geteuid() != 0 or python is None:
        pytest.skip("needs root and a Python >= 3.11 that any user can run")
    secret = f"pod-secret-{uuid.uuid4().hex}"
    env = {"PATH": "/usr/bin:/bin", "POD_SECRET": secret, "PYTHONDONTWRITEBYTECODE": "1"}
    finished = subprocess.run(
        [python, "-c", _CALLER.format(services=str(readable_services))],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr
    report = json.loads(finished.stdout.splitlines()[-1])
    for mode, seen in report.items():
        assert seen["status"] == "ok", (mode, seen["stderr"])
        assert seen["loop"] == "timeout"
        assert secret not in seen["stdout"], mode  # not in /proc/<caller>/environ either
        assert "unprivileged_user" in seen["protections"]
    fallback = report["rlimits"]
    assert fallback["mode"] == "rlimits"
    assert "caller_not_dumpable" in fallback["protections"]
    if report["auto"]["mode"] == "bwrap":
        assert {"user_namespace", "no_userns", "pid_namespace"} <= set(
            report["auto"]["protections"]
        )
