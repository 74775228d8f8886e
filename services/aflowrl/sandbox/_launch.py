"""How sandbox workers start: the isolation plan, its command line, and the host user it runs as.

:class:`aflowrl.sandbox.pool.SandboxPool` asks :func:`candidate_plans` for the plans its mode
allows, best first, and keeps the first whose worker starts; :mod:`aflowrl.sandbox._worker`
builds each worker's command from the plan. The plans:

- ``bwrap`` as root: bubblewrap creates PID, network, IPC, UTS and mount namespaces without a user
  namespace (a user namespace made by root maps the sandbox back to root), the zygote drops to a
  host uid reserved for that worker before anything else runs, and only the system directories,
  a few files of /etc and the interpreter's own directories are mounted, read-only.
- ``bwrap`` as another user: the same inside an unprivileged user namespace, with further user
  namespaces disabled.
- ``rlimits`` as root: no namespaces; the zygote runs as a reserved uid (which keeps the caller's
  processes and root-only files out of reach and makes RLIMIT_NPROC bind) when that uid can run
  the interpreter, else as the caller, with a warning.
- ``rlimits`` as another user: limits and cleanup only; the caller is made non-dumpable so code
  of the same uid cannot read its memory or environment through /proc.

In every plan each run also gets the zygote's seccomp filter where libseccomp is installed
(no sockets but AF_UNIX, none at all without a network namespace; no signals to the zygote or
the pool; no new user namespaces, ptrace, keyrings, bpf, io_uring), which is what keeps the
rlimits plans' zygote alive to clean up and their code off the network.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import functools
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from aflowrl.sandbox import _zygote
from aflowrl.sandbox.errors import SandboxLimitError, SandboxUnavailableError
from aflowrl.sandbox.result import Mode

logger = logging.getLogger(__name__)

Kind = Literal["bwrap-root", "bwrap-userns", "rlimits-uid", "rlimits-caller"]

UID_BASE = 0x70000000
"""First host uid reserved for sandbox workers when running as root (one uid per live worker)."""
_UID_SLOTS = 4096
_SANDBOX_UID = 65534
"""The code's uid as seen inside an unprivileged user namespace ("nobody")."""

_COMMON = (
    "rlimits",
    "wall_clock_kill",
    "scrubbed_env",
    "temp_dir",
    "output_cap",
    "memory_watchdog",
    "no_new_privs",
)
_NAMESPACES = ("pid_namespace", "no_network", "private_filesystem", "ipc_namespace")
_CONTAINED = ("kill_leftovers",)
"""Nothing of a run outlives it: it cannot hide from the sweep, nor kill the zygote to escape."""
PROTECTIONS: dict[Kind, tuple[str, ...]] = {
    "bwrap-root": (*_COMMON, *_CONTAINED, *_NAMESPACES, "unprivileged_user", "dedicated_user"),
    "bwrap-userns": (
        *_COMMON,
        *_CONTAINED,
        *_NAMESPACES,
        "unprivileged_user",
        "user_namespace",
        "no_userns",
    ),
    "rlimits-uid": (*_COMMON, *_CONTAINED, "unprivileged_user", "dedicated_user"),
    "rlimits-caller": _COMMON,
}
"""Protections of each plan before the seccomp filter ("unprivileged_user" and
"caller_not_dumpable" are added to ``rlimits-caller`` when the caller is not root)."""

ALL_PROTECTIONS = tuple(
    dict.fromkeys(
        [p for names in PROTECTIONS.values() for p in names]
        + ["seccomp", "no_userns", "caller_not_dumpable"]
    )
)
"""Every protection name a pool may report."""

_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = (
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/alternatives",
    "/etc/mime.types",
    "/etc/os-release",
)
_WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
_PRELOAD = (
    "math",
    "cmath",
    "collections",
    "itertools",
    "functools",
    "re",
    "heapq",
    "bisect",
    "string",
    "typing",
    "random",
    "datetime",
    "decimal",
    "fractions",
    "statistics",
    "copy",
    "operator",
    "json",
    "traceback",
    "ast",
    "hashlib",
    "fcntl",
)
"""Modules the zygote imports once so runs that use them start faster."""


def _zygote_source() -> str:
    return Path(_zygote.__file__).read_text()


@dataclass(frozen=True)
class Plan:
    """One way of starting workers, with the protections it gives."""

    kind: Kind
    python: str
    tmpfs_bytes: int
    bwrap: str | None = None
    extra_protections: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    @property
    def mode(self) -> Mode:
        """``bwrap`` or ``rlimits``."""
        return "bwrap" if self.kind.startswith("bwrap") else "rlimits"

    @property
    def needs_uid(self) -> bool:
        """Whether each worker runs as its own reserved host uid."""
        return self.kind in ("bwrap-root", "rlimits-uid")

    def protections(self, seccomp: bool) -> tuple[str, ...]:
        """Protections active for code run under this plan (with or without the filter)."""
        names = [*PROTECTIONS[self.kind], *self.extra_protections]
        if seccomp:
            # The zygote is shielded from signals; sockets are refused but AF_UNIX (all of
            # them without a network namespace).
            names += ["seccomp", "no_userns", "kill_leftovers", "no_network"]
        return tuple(dict.fromkeys(names))

    def command(self, uid: int | None, base_dir: str | None) -> tuple[list[str], dict[str, Any]]:
        """The worker's argv and the extra keyword arguments of its ``Popen``."""
        base = "/tmp" if self.bwrap is not None else base_dir
        assert base is not None
        run_dir = os.path.join(base, _zygote.RUN_DIR)
        # The zygote's environment is the code's: it never changes between runs.
        env = {**self.env, "HOME": run_dir, "TMPDIR": run_dir}
        config: dict[str, Any] = {"base_dir": base, "preload": list(_PRELOAD)}
        interpreter = [self.python, "-I", "-S", "-B", "-c", _zygote_source()]
        if self.bwrap is not None:
            filesystem = self.filesystem
            wiped = (base, "/dev/shm")
            config.update(
                wipe_dirs=["/dev/shm"],
                pid_namespace=True,
                # Interpreter binds inside the private /tmp (a checkout or venv under /tmp)
                # are part of the sandbox, not leftovers of a run.
                keep=[p for p in filesystem.binds if any(_inside(p, d) for d in wiped)],
                readable=filesystem.interpreter,
            )
            if self.kind == "bwrap-root":
                config.update(dedicated_uid=True, drop_uid=uid)
            argv = [self.bwrap, *self._bwrap_args(env), "--", *interpreter, json.dumps(config)]
            return argv, {"env": {}}
        config.update(dedicated_uid=self.kind == "rlimits-uid")
        config["block_sockets"] = True  # no network namespace: the seccomp filter stands in
        kwargs: dict[str, Any] = {"env": env, "cwd": base}
        if self.kind == "rlimits-uid":
            config["owned_dirs"] = [d for d in _WORLD_WRITABLE if os.path.isdir(d)]
            kwargs.update(user=uid, group=uid, extra_groups=[])
        return [*interpreter, json.dumps(config)], kwargs

    @functools.cached_property
    def filesystem(self) -> Filesystem:
        """What bubblewrap shows of the host (computed once per plan)."""
        return host_filesystem(self.python)

    async def namespaces_work(self) -> tuple[bool, str]:
        """Whether bubblewrap can make this plan's namespaces here at all (running ``true`` with
        only the system visible), and what it said: tells a kernel or container that refuses
        namespaces from a sandbox of ours that is broken."""
        assert self.bwrap is not None
        true = shutil.which("true", path="/usr/bin:/bin")
        if true is None:
            return False, "no `true` command in /usr/bin or /bin to test bubblewrap with"
        system = host_filesystem(None)
        argv = [self.bwrap, *self._namespace_args(), *self._mount_args(system), "--", true]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env={},
            )
            _, err = await asyncio.wait_for(proc.communicate(), 60)
        except (OSError, subprocess.SubprocessError, TimeoutError) as exc:
            return False, str(exc) or type(exc).__name__
        detail = err.decode(errors="replace").strip()
        return proc.returncode == 0, detail or f"exit status {proc.returncode}"

    def _namespace_args(self) -> list[str]:
        args = ["--die-with-parent", "--new-session", "--as-pid-1", "--clearenv"]
        if self.kind == "bwrap-root":
            args += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
            args += ["--unshare-cgroup-try", "--cap-drop", "ALL"]
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]  # for the drop only
        else:
            args += ["--unshare-all", "--unshare-user", "--disable-userns"]
            args += ["--uid", str(_SANDBOX_UID), "--gid", str(_SANDBOX_UID), "--cap-drop", "ALL"]
        return [*args, "--hostname", "sandbox"]

    def _mount_args(self, filesystem: Filesystem) -> list[str]:
        """The sandbox's own mounts first, then the host's binds: a bind under /tmp or /dev/shm
        (a checkout in a ``mktemp -d`` directory) lands on the private tmpfs, not under it."""
        args = ["--proc", "/proc", "--dev", "/dev"]
        args += ["--perms", "1777", "--size", str(self.tmpfs_bytes), "--tmpfs", "/tmp"]
        args += ["--perms", "1777", "--size", str(self.tmpfs_bytes // 4), "--tmpfs", "/dev/shm"]
        args += filesystem.args()
        return [*args, "--remount-ro", "/"]

    def _bwrap_args(self, env: dict[str, str]) -> list[str]:
        args = self._namespace_args()
        for name, value in env.items():
            args += ["--setenv", name, value]
        return [*args, *self._mount_args(self.filesystem), "--chdir", "/tmp"]

    def make_base_dir(self, uid: int | None) -> str | None:
        """The private directory a fallback worker's runs live in (None under bubblewrap)."""
        if self.bwrap is not None:
            return None
        base = tempfile.mkdtemp(prefix="aflowrl-sandbox-")
        if uid is not None:
            os.chown(base, uid, uid)
        return base

    async def cleanup(self, uid: int | None, base_dir: str | None) -> None:
        """After a worker is gone: kill what its user left running and delete its files."""
        if self.kind == "rlimits-uid" and uid is not None:
            await asyncio.to_thread(_kill_user, uid)
            for directory in _WORLD_WRITABLE:
                for path in _owned_entries(directory, uid):
                    await asyncio.to_thread(_remove_tree, path)
        if base_dir is not None:
            await asyncio.to_thread(_remove_tree, base_dir)


def _owned_entries(directory: str, uid: int) -> list[str]:
    """Paths directly in ``directory`` that belong to ``uid``."""
    owned = []
    with contextlib.suppress(OSError), os.scandir(directory) as listing:
        for entry in listing:
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    owned.append(entry.path)
    return owned


def _kill_user(uid: int) -> None:
    """SIGKILL every process of ``uid`` (a reserved sandbox uid) until none is left."""
    for _ in range(5000):
        found = False
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            status = _zygote.process_status(name)
            if status is None or status[0] != uid or status[1] in "ZX":
                continue  # gone, another user's, or dead and waiting for its parent to reap it
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(name), signal.SIGKILL)
            found = True
        if not found:
            return
        time.sleep(0.001)
    logger.error("processes of sandbox uid %d survive SIGKILL", uid)


def _remove_tree(path: str) -> None:
    """Delete a tree whatever its depth or modes (``rm -rf``, which never follows links)."""
    if os.path.isdir(path) and not os.path.islink(path):
        subprocess.run(["rm", "-rf", "--one-file-system", "--", path], check=False)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def base_env(python: str) -> dict[str, str]:
    """The environment the code sees, but for HOME and TMPDIR (its working directory)."""
    return {
        "PATH": f"{os.path.dirname(python)}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        # One thread per numeric library and two malloc arenas: the address-space limit
        # otherwise goes to thread stacks and arenas the code never asked for.
        "MALLOC_ARENA_MAX": "2",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "NUMEXPR_NUM_THREADS": "1",
    }


def candidate_plans(setting: str, python: str, tmpfs_mb: int) -> list[Plan]:
    """Plans ``setting`` (auto, bwrap, rlimits) allows on this machine, best first."""
    if setting not in ("auto", "bwrap", "rlimits"):
        raise SandboxLimitError(
            f"must be 'auto', 'bwrap' or 'rlimits', got {setting!r}", field="AFLOWRL_SANDBOX"
        )
    root = os.geteuid() == 0
    env = base_env(python)
    tmpfs_bytes = tmpfs_mb << 20
    plans: list[Plan] = []
    if setting in ("auto", "bwrap"):
        bwrap = shutil.which("bwrap")
        if bwrap is not None:
            kind: Kind = "bwrap-root" if root else "bwrap-userns"
            plans.append(Plan(kind, python, tmpfs_bytes, bwrap=bwrap, env=env))
        elif setting == "bwrap":
            raise SandboxUnavailableError(
                "AFLOWRL_SANDBOX=bwrap but no bwrap on PATH (Debian package: bubblewrap)"
            )
    if setting in ("auto", "rlimits"):
        if root:
            plans.append(Plan("rlimits-uid", python, tmpfs_bytes, env=env))
            plans.append(Plan("rlimits-caller", python, tmpfs_bytes, env=env))
        else:
            extra = ("unprivileged_user", "caller_not_dumpable")
            plans.append(
                Plan("rlimits-caller", python, tmpfs_bytes, extra_protections=extra, env=env)
            )
    return plans


def harden_caller(plan: Plan) -> None:
    """Make the caller non-dumpable when its code runs under the caller's own uid.

    Same-uid processes may otherwise read ``/proc/<caller>/environ`` (API keys) and its memory.
    Core dumps and same-user debuggers of this process stop working; root still can attach.
    """
    if "caller_not_dumpable" not in plan.extra_protections:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        raise SandboxUnavailableError("cannot make the calling process non-dumpable")
    logger.warning(
        "sandbox code runs as this process's own user: made this process non-dumpable so the "
        "code cannot read its memory or environment"
    )


_SANDBOX_MOUNTS = ("/proc", "/dev", "/tmp", "/dev/shm")
"""Directories bubblewrap mounts afresh in every sandbox."""


@dataclass(frozen=True)
class Filesystem:
    """What a bubblewrap sandbox shows of the host: read-only binds at the same paths, links,
    and the interpreter's directories among the binds (which the code's user must be able to
    read: the zygote checks that before it serves)."""

    binds: list[str]
    links: list[tuple[str, str]]
    interpreter: list[str]

    def args(self) -> list[str]:
        """bubblewrap arguments: parent directories, binds, links."""
        made = set(self.binds) | set(_SANDBOX_MOUNTS)
        ancestors = {parent for path in self.binds for parent in _ancestors(path)} - made
        args: list[str] = []
        for directory in sorted(ancestors, key=lambda p: (p.count("/"), p)):
            args += ["--perms", "0755", "--dir", directory]
        for path in self.binds:
            args += ["--ro-bind", path, path]
        for target, link in self.links:
            args += ["--symlink", target, link]
        return args


def host_filesystem(python: str | None) -> Filesystem:
    """The system directories, a few files of /etc and (with ``python``) the interpreter's
    directories: nothing else of the host is visible."""
    binds: list[str] = []
    links: list[tuple[str, str]] = []
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            links.append((os.readlink(path), path))
        elif os.path.isdir(path):
            binds.append(path)
    binds += [path for path in _ETC_FILES if os.path.exists(path)]
    interpreter = _interpreter_dirs(python) if python is not None else []
    return Filesystem(_outermost(binds + interpreter), links, interpreter)


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _interpreter_dirs(python: str) -> list[str]:
    """The prefixes the interpreter reads (a virtual environment and the base install)."""
    # The same path, not the same binary: virtual environments share their base's binary.
    if os.path.abspath(python) == os.path.abspath(sys.executable):
        prefixes = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]
    else:
        try:
            probe = subprocess.run(
                [
                    python,
                    "-I",
                    "-c",
                    "import sys,json;print(json.dumps([sys.prefix,sys.exec_prefix,"
                    "sys.base_prefix,sys.base_exec_prefix]))",
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise SandboxUnavailableError(f"interpreter {python} does not run: {exc}") from None
        if probe.returncode != 0:
            raise SandboxUnavailableError(f"interpreter {python} does not run: {probe.stderr}")
        prefixes = json.loads(probe.stdout)
    prefixes.append(os.path.dirname(os.path.abspath(python)))
    prefixes.append(os.path.dirname(os.path.dirname(os.path.realpath(python))))
    found: list[str] = []
    for prefix in prefixes:
        for path in (os.path.abspath(prefix), os.path.realpath(prefix)):
            if path != "/" and os.path.isdir(path) and path not in found:
                found.append(path)
    return found


def _outermost(paths: list[str]) -> list[str]:
    """Drop paths inside another path of the list (one bind covers them)."""
    unique = sorted(set(paths), key=len)
    kept: list[str] = []
    for path in unique:
        if not any(_inside(path, k) for k in kept):
            kept.append(path)
    return kept


def _ancestors(path: str) -> list[str]:
    parents = []
    parent = os.path.dirname(path)
    while parent not in ("/", ""):
        parents.append(parent)
        parent = os.path.dirname(parent)
    return parents


class UidLease:
    """A host uid reserved for one worker: an exclusive ``flock`` held while the worker lives.

    Locks live in /run/aflowrl-sandbox, so pools in different processes never share a uid (which
    would let one run's cleanup kill another's processes).
    """

    def __init__(self, uid: int, fd: int) -> None:
        self.uid = uid
        self._fd: int | None = fd

    @classmethod
    def acquire(cls) -> UidLease:
        """Reserve the lowest free uid from :data:`UID_BASE` on."""
        lock_dir = Path("/run/aflowrl-sandbox")
        if not os.access("/run", os.W_OK):
            lock_dir = Path(tempfile.gettempdir()) / "aflowrl-sandbox-uids"
        lock_dir.mkdir(mode=0o700, exist_ok=True)
        info = lock_dir.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise SandboxUnavailableError(f"{lock_dir} is not a directory owned by this user")
        for slot in range(_UID_SLOTS):
            uid = UID_BASE + slot
            fd = os.open(lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return cls(uid, fd)
        raise SandboxUnavailableError(f"all {_UID_SLOTS} sandbox uids are in use")

    def release(self) -> None:
        """Give the uid back (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
