"""The fork server that runs inside each sandbox worker: one child per run, fresh limits each time.

:mod:`aflowrl.sandbox._worker` starts this file's source as ``python -I -S -B -c SOURCE CONFIG``,
inside bubblewrap or (the rlimits fallback) directly. It imports only the standard library: the
sandbox sees neither aflow-rl nor the caller's files. The parent imports the same module for its
framing helpers, so both ends of the pipe share one definition of the protocol. It is one file
because it travels as one program.

Protocol, on the zygote's stdin (requests) and stdout (replies): a frame is a 4-byte big-endian
length, a JSON header of that length, then the byte payloads whose sizes the header lists under
``"sizes"``. The zygote first sends ``{"ready": true, ...}``; then, for each request (code and
stdin payloads, limits in the header), one result (stdout and stderr payloads, status in the
header). End of input makes it exit.

Per run the zygote makes an empty working directory, forks, and the child sets its own session,
rlimits (CPU, address space, file size, processes, open files, no core dumps, no message queues),
signal dispositions, environment and ``__main__`` before executing the code in-process, as
``python main.py`` would. The zygote enforces the wall clock, caps output, watches the summed
memory of multi-process runs, then kills every process the run left (its own PID namespace, or
every process of its dedicated user, or everything below it as child subreaper), wipes the
scratch directories and System V IPC objects, and reports. It is non-dumpable, so the code it
forks cannot ptrace it or read its memory or file descriptors; as PID 1 of a PID namespace it
also cannot be signalled by them.

A run with ``private_main`` also gets a *companion*: a second process of the run, with the same
limits and filter, connected to the main process by two pipes (each reads fd 3 and writes fd 4;
see :data:`COMPANION_FDS`). It runs the Python program the main process first writes to it (a
4-byte length, then the source), as ``__main__`` with ``sys.argv == [COMPANION_ARGV0]``, its
stdin, stdout and stderr on /dev/null. Companions are forked by a *template*: a process the zygote
forks at start, after its imports and before it reads any request, so a companion holds no data
of any run (as clean as a new interpreter, started in a millisecond instead of tens). The
template is non-dumpable and shielded from the runs' signals by the filter; if it dies anyway,
the worker is replaced. The main process of such a run stays non-dumpable: its companion (the
code benchmarks' answer, see ``aflowrl.benchmarks._verdict``) cannot read or write its memory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from typing import Any, NoReturn

_LENGTH = struct.Struct(">I")
MAX_HEADER_BYTES = 1 << 20
"""Largest JSON header either end accepts (headers are small; payloads travel after them)."""

RUN_DIR = "run"
"""Name of each run's working directory in the worker's base directory (HOME and TMPDIR of the
code, set in the zygote's environment when it starts)."""

COMPANION_FDS = (3, 4)
"""File descriptors of a ``private_main`` run's main process and of its companion: each reads
what the other writes from the first and writes to the second."""

COMPANION_ARGV0 = "<companion>"
"""``sys.argv[0]`` (and the file name of the code) of a companion."""

MAX_COMPANION_PROGRAM_BYTES = 16 << 20
"""Largest program a main process may send its companion."""

_CLEANUP_S = 1.0
"""Most time spent deleting a run's files; past it the worker is replaced instead."""

_TICK_S = 0.05
"""How often the supervisor checks the clock and the memory of multi-process runs."""

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
_SECBITS_LOCKED_NOROOT = 0x2F
"""SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP, SECBIT_KEEP_CAPS_LOCKED and their locks: a later
exec gives no capability back."""
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_IPC_RMID = 0
_AF_UNIX = 1


def encode_frame(header: dict[str, Any], *payloads: bytes) -> bytes:
    """One frame: length, JSON header (with the payload sizes added), payloads."""
    head = json.dumps({**header, "sizes": [len(p) for p in payloads]}).encode()
    return b"".join((_LENGTH.pack(len(head)), head, *payloads))


def decode_header(raw: bytes) -> tuple[dict[str, Any], list[int]]:
    """Parse a header; returns it and the payload sizes it announces."""
    header = json.loads(raw)
    if not isinstance(header, dict):
        raise ValueError("frame header is not a JSON object")
    sizes = header.pop("sizes", [])
    if not isinstance(sizes, list) or not all(isinstance(n, int) and n >= 0 for n in sizes):
        raise ValueError("frame header has bad payload sizes")
    return header, sizes


def header_length(prefix: bytes) -> int:
    """The header length a frame's 4-byte prefix announces (bounded)."""
    length: int = _LENGTH.unpack(prefix)[0]
    if length > MAX_HEADER_BYTES:
        raise ValueError(f"frame header of {length} bytes exceeds {MAX_HEADER_BYTES}")
    return length


# ---------------------------------------------------------------------------------------------
# The zygote process
# ---------------------------------------------------------------------------------------------


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _read_request(fd: int) -> tuple[dict[str, Any], list[bytes]] | None:
    prefix = _read_exact(fd, _LENGTH.size)
    if prefix is None:
        return None
    raw = _read_exact(fd, header_length(prefix))
    if raw is None:
        return None
    header, sizes = decode_header(raw)
    payloads = []
    for size in sizes:
        data = _read_exact(fd, size)
        if data is None:
            return None
        payloads.append(data)
    return header, payloads


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _Libc:
    """The few libc calls the standard library lacks (prctl, System V IPC removal)."""

    def __init__(self) -> None:
        import ctypes

        self._lib = ctypes.CDLL(None, use_errno=True)

    def prctl(self, option: int, value: int, pointer: Any = 0) -> None:
        if self._lib.prctl(option, value, pointer, 0, 0) != 0:
            import ctypes

            err = ctypes.get_errno()
            raise OSError(err, f"prctl({option}) failed: {os.strerror(err)}")

    def drop_capabilities(self) -> None:
        """Give up every capability for good (root whose code must not reach other processes
        of root, e.g. through /proc/<pid>/mem): bounding set, securebits, then capset."""
        import ctypes

        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
        for cap in range(last + 1):
            self._lib.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
        self.prctl(_PR_SET_SECUREBITS, _SECBITS_LOCKED_NOROOT)
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, ourselves
        data = (ctypes.c_uint32 * 6)()
        if self._lib.capset(header, data) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"capset failed: {os.strerror(err)}")

    def remove_sysv_ipc(self, uid: int) -> None:
        """Remove every System V shared memory segment, semaphore set and queue of ``uid``."""
        lib = self._lib
        for row in _sysv_rows("shm", uid):
            lib.shmctl(int(row["shmid"]), _IPC_RMID, None)
        for row in _sysv_rows("sem", uid):
            lib.semctl(int(row["semid"]), 0, _IPC_RMID)
        for row in _sysv_rows("msg", uid):
            lib.msgctl(int(row["msqid"]), _IPC_RMID, None)


def _sysv_rows(kind: str, uid: int) -> list[dict[str, str]]:
    """Rows of /proc/sysvipc/``kind`` (shm, sem, msg) owned by ``uid``, by column name."""
    try:
        with open(f"/proc/sysvipc/{kind}") as table:
            lines = table.read().splitlines()
    except OSError:
        return []
    if not lines:
        return []
    columns = lines[0].split()
    rows = [dict(zip(columns, line.split(), strict=False)) for line in lines[1:]]
    return [row for row in rows if row.get("uid") == str(uid)]


class _SeccompFilter:
    """A seccomp-BPF filter compiled once with libseccomp, loaded by each child before the code.

    It refuses what no generated program needs and what widens the kernel's attack surface or
    survives the run: new user namespaces (so no private mounts or tmpfs outside the limits),
    ``clone3`` (ENOSYS, so the C library falls back to the ``clone`` checked here), ``setns``,
    becoming non-dumpable (which would hide a process's memory from the supervisor),
    ``ptrace``, ``process_vm_readv`` / ``writev``, ``kcmp``, ``pidfd_getfd`` (reading or writing
    another process, e.g. a non-dumpable verdict driver when the code runs as root), kernel
    keyrings, ``bpf``, ``perf_event_open``, ``userfaultfd``, io_uring, ``syslog``, terminal
    injection, signals to every process (``kill(-1)``) or to the zygote and
    the pool, and sockets other than AF_UNIX ones (no network: where there is a network namespace
    this is belt and braces). With ``block_sockets`` (no namespaces, so the host's Unix sockets
    are in reach), ``socket()`` is refused altogether; ``socketpair()`` always works. The same
    approach as Flatpak's filter.
    """

    _ALLOW = 0x7FFF0000
    _CMP_NE = 1
    _CMP_EQ = 4
    _CMP_MASKED_EQ = 7
    _CLONE_NEWUSER = 0x10000000
    _TIOCSTI = 0x5412
    _DENIED = (
        "setns",
        "ptrace",
        "keyctl",
        "add_key",
        "request_key",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "syslog",
        "process_vm_readv",
        "process_vm_writev",
        "kcmp",
        "pidfd_getfd",
    )

    def __init__(self, block_sockets: bool, protected_pids: list[int]) -> None:
        import ctypes
        import errno

        self._ctypes = ctypes
        lib = ctypes.CDLL("libseccomp.so.2")
        lib.seccomp_init.restype = ctypes.c_void_p
        lib.seccomp_init.argtypes = [ctypes.c_uint32]
        lib.seccomp_release.argtypes = [ctypes.c_void_p]
        lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]

        class _Arg(ctypes.Structure):
            _fields_ = [
                ("arg", ctypes.c_uint),
                ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64),
            ]

        lib.seccomp_rule_add_array.argtypes = [
            ctypes.c_void_p,
            ctypes.c_uint32,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.POINTER(_Arg),
        ]
        ctx = lib.seccomp_init(self._ALLOW)
        if not ctx:
            raise OSError("seccomp_init failed")
        try:

            def rule(name: str, error: int, *conditions: tuple[int, int, int, int]) -> None:
                number = lib.seccomp_syscall_resolve_name(name.encode())
                if number < 0:  # not a system call of this architecture
                    return
                args = (_Arg * len(conditions))(*(_Arg(*c) for c in conditions))
                action = 0x00050000 | error  # SCMP_ACT_ERRNO(error)
                rc = lib.seccomp_rule_add_array(ctx, action, number, len(conditions), args)
                if rc < 0:
                    raise OSError(-rc, f"seccomp rule for {name}: {os.strerror(-rc)}")

            newuser = (0, self._CMP_MASKED_EQ, self._CLONE_NEWUSER, self._CLONE_NEWUSER)
            rule("unshare", errno.EPERM, newuser)
            rule("clone", errno.EPERM, newuser)
            rule("clone3", errno.ENOSYS)
            for name in self._DENIED:
                rule(name, errno.EPERM)
            rule("ioctl", errno.EPERM, (1, self._CMP_MASKED_EQ, 0xFFFFFFFF, self._TIOCSTI))
            # Non-dumpable processes hide their memfds and memory from the supervisor's watch.
            rule("prctl", errno.EPERM, (0, self._CMP_EQ, _PR_SET_DUMPABLE, 0))
            if block_sockets:  # socketpair() stays: pipes between the run's own processes
                rule("socket", errno.EACCES)
            else:
                rule("socket", errno.EACCES, (0, self._CMP_NE, _AF_UNIX, 0))
            # Signals to everything (-1), and to the zygote and its parent (the pool) or their
            # process groups: where they share the code's uid, nothing else stops them. Only
            # the low 32 bits of a pid_t argument count.
            signallers = ("tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open")
            for pid in (-1, *protected_pids, *(-p for p in protected_pids)):
                low = (0, self._CMP_MASKED_EQ, 0xFFFFFFFF, pid & 0xFFFFFFFF)
                for name in ("kill", *signallers) if pid > 0 else ("kill",):
                    rule(name, errno.EPERM, low)
            rule("pidfd_send_signal", errno.EPERM)  # a /proc/<pid> directory works as a pidfd
            fd = os.memfd_create("seccomp")
            try:
                if lib.seccomp_export_bpf(ctx, fd) < 0:
                    raise OSError("seccomp_export_bpf failed")
                size = os.lseek(fd, 0, os.SEEK_END)
                program = os.pread(fd, size, 0)
            finally:
                os.close(fd)
        finally:
            lib.seccomp_release(ctx)

        class _Fprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        self._buffer = ctypes.create_string_buffer(program, len(program))
        self._fprog = _Fprog(len(program) // 8, ctypes.addressof(self._buffer))

    def load(self, libc: _Libc) -> None:
        """Install the filter in the calling process (needs no_new_privs, set by the zygote)."""
        libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, self._ctypes.byref(self._fprog))


def _load_filter(block_sockets: bool, protected: list[int]) -> _SeccompFilter | None:
    """The runs' seccomp filter, or None (with a note on stderr) where libseccomp is missing."""
    try:
        return _SeccompFilter(block_sockets, protected)
    except (OSError, AttributeError) as exc:
        print(f"sandbox: no seccomp filter ({exc})", file=sys.stderr, flush=True)
        return None


class _Template:
    """Forks companions (see the module docstring); forked by the zygote before any request.

    Requests come from the zygote over a SOCK_SEQPACKET socket: the run's request with
    ``nproc`` and ``run_dir`` added, and the companion's two pipe ends."""

    def __init__(self, zygote: _Zygote, sock: socket.socket, protected: list[int]) -> None:
        self.zygote = zygote
        self.sock = sock
        self.protected = protected

    def serve(self) -> NoReturn:
        try:
            self.zygote.libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # cleared by the fork
            signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps its companions
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)  # (the pool's pipes are the zygote's alone; stderr stays for notes)
            keep = self.sock.fileno()
            os.closerange(3, keep)
            os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
            seccomp = _load_filter(self.zygote.block_sockets, self.protected)
            import gc

            gc.collect()
            gc.freeze()
            while True:
                message, fds, _flags, _address = socket.recv_fds(self.sock, 1 << 16, 2)
                if not message:
                    os._exit(0)  # the zygote is gone
                if len(fds) != 2:
                    for fd in fds:
                        os.close(fd)
                    continue
                if os.fork() == 0:
                    self.sock.close()
                    _companion(self.zygote, seccomp, json.loads(message), (fds[0], fds[1]))
                for fd in fds:
                    os.close(fd)
        except BaseException as exc:  # noqa: BLE001  # the zygote sees it gone: worker replaced
            with contextlib.suppress(BaseException):
                os.write(2, f"sandbox: the companion template failed: {exc!r}\n".encode())
            os._exit(1)


class _Zygote:
    """The fork server. ``config`` (JSON from the launcher): ``base_dir`` (runs live in
    ``base_dir/run``; wiped after each), ``wipe_dirs`` (also wiped), ``owned_dirs`` (shared
    directories cleared of this uid's entries), ``pid_namespace`` (the zygote is PID 1 of its
    own namespace), ``dedicated_uid`` (nobody else has this uid), ``drop_uid`` (become it first),
    ``block_sockets`` (no ``socket()`` at all), ``preload`` (modules to import once), ``keep``
    (read-only binds inside the wiped directories: the interpreter of a checkout under /tmp),
    ``readable`` (the interpreter's directories, which the code's user must be able to read)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.base_dir: str = config["base_dir"]
        self.wipe_dirs: list[str] = config.get("wipe_dirs", [])
        self.owned_dirs: list[str] = config.get("owned_dirs", [])
        self.pid_namespace: bool = config.get("pid_namespace", False)
        self.dedicated_uid: bool = config.get("dedicated_uid", False)
        self.drop_uid: int | None = config.get("drop_uid")
        self.preload: list[str] = config.get("preload", [])
        self.block_sockets: bool = config.get("block_sockets", False)
        self.keep: list[str] = config.get("keep", [])
        self.readable: list[str] = config.get("readable", [])
        self.kept_ids: dict[str, tuple[int, int]] = {}
        self.template_pid: int | None = None
        self.template_sock: socket.socket | None = None
        self.libc = _Libc()
        self.seccomp: _SeccompFilter | None = None
        self.runs = 0

    # -- start-up ------------------------------------------------------------------------------

    def start(self) -> None:
        if self.drop_uid is not None:
            # Privileged bubblewrap: leave root before any code but this runs.
            os.setgroups([])
            os.setresgid(self.drop_uid, self.drop_uid, self.drop_uid)
            os.setresuid(self.drop_uid, self.drop_uid, self.drop_uid)
        self.libc.prctl(_PR_SET_NO_NEW_PRIVS, 1)
        self.libc.prctl(_PR_SET_DUMPABLE, 0)
        # Die with the parent (bubblewrap or the pool). A change of uid clears this setting, so
        # it is set after the drop; a parent that died before that shows as end of input.
        self.libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if not self.pid_namespace:
            # Orphans of a run are re-parented here, so the sweep finds them all.
            self.libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)
        # As PID 1 only signals with a handler get through from inside the namespace: no handler
        # at all means the code cannot stop or kill its supervisor.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self._check_readable()
        import site

        site.main()  # the interpreter's site-packages (a virtual environment's too)
        for name in self.preload:
            with contextlib.suppress(ImportError):
                __import__(name)
        protected = [pid for pid in (os.getpid(), os.getppid()) if pid > 1]
        self._fork_template(protected)  # before any request: it never holds a run's data
        self.seccomp = _load_filter(self.block_sockets, protected)
        self.remember_kept()
        self._wipe()

    def _fork_template(self, protected: list[int]) -> None:
        """Fork the process that forks companions; ``protected`` gains its pid."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            ours.close()
            _Template(self, theirs, [*protected, os.getpid()]).serve()
        theirs.close()
        self.template_pid, self.template_sock = pid, ours
        protected.append(pid)

    def _reap(self) -> None:
        """Collect dead children (noting the template's death)."""
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.template_pid:
                self.template_pid = None

    def template_alive(self) -> bool:
        """Whether the template still runs (its death makes the worker dirty)."""
        if self.template_pid is None:
            return False
        try:
            pid, _ = os.waitpid(self.template_pid, os.WNOHANG)
        except ChildProcessError:  # already reaped
            self.template_pid = None
            return False
        if pid:
            self.template_pid = None
        return pid == 0

    def remember_kept(self) -> None:
        """Note which files the kept binds are, to tell after each run that they are still there."""
        for path in self.keep:
            info = os.stat(path)
            self.kept_ids[path] = (info.st_dev, info.st_ino)

    def _check_readable(self) -> None:
        """Refuse to serve when the code's user cannot read the interpreter (a root-owned venv
        in a 0700 directory, seen by a dropped uid): every import would fail in the runs."""
        for path in self.readable:
            if not os.access(path, os.R_OK | os.X_OK):
                try:
                    mode = f"mode {os.stat(path).st_mode & 0o7777:04o}"
                except OSError as exc:
                    mode = exc.strerror or "not found"
                print(
                    f"sandbox: uid {os.getuid()} cannot read the interpreter's directory {path} "
                    f"({mode}): make it readable by other users",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(3)

    def serve(self) -> None:
        import gc

        gc.collect()
        gc.freeze()  # keep the zygote's objects out of the children's copy-on-write faults
        _write_all(
            1,
            encode_frame(
                {
                    "ready": True,
                    "pid": os.getpid(),
                    "uid": os.getuid(),
                    "python": sys.version.split()[0],
                    "seccomp": self.seccomp is not None,
                }
            ),
        )
        while True:
            request = _read_request(0)
            if request is None:
                return
            header, payloads = request
            result, stdout, stderr = self._run(header, payloads[0], payloads[1])
            _write_all(1, encode_frame(result, stdout, stderr))

    # -- one run ---------------------------------------------------------------------------------

    def _run(
        self, req: dict[str, Any], code: bytes, stdin: bytes
    ) -> tuple[dict[str, Any], bytes, bytes]:
        self.runs += 1
        run_dir = os.path.join(self.base_dir, RUN_DIR)
        if os.path.lexists(run_dir):
            _remove(run_dir)
        os.mkdir(run_dir, 0o700)
        main_path = os.path.join(run_dir, "main.py")
        with open(main_path, "wb") as f:
            f.write(code)
        nproc = int(req["processes"]) + 2  # the zygote and the template are of the same user
        if not (self.pid_namespace or self.dedicated_uid or os.getuid() == 0):
            nproc += _tasks_of_uid(os.getuid())  # the caller's own threads count too
        stdin_r, stdin_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        sys.stderr.flush()
        started = time.monotonic()
        companion = self._start_companion(req, nproc, run_dir) if req.get("private_main") else ()
        pid = os.fork()
        if pid == 0:
            _child(
                self,
                req,
                nproc=nproc,
                run_dir=run_dir,
                main_path=main_path,
                stdio=(stdin_r, out_w, err_w),
                companion=companion,
            )
        for fd in (stdin_r, out_w, err_w, *companion):
            os.close(fd)
        outcome = _Supervisor(
            self, pid, req, stdin_w=stdin_w, stdin=stdin, out_r=out_r, err_r=err_r, started=started
        ).supervise()
        outcome["dirty"] = not self._cleanup()
        outcome["runs"] = self.runs
        return outcome, outcome.pop("stdout"), outcome.pop("stderr")

    def _start_companion(self, req: dict[str, Any], nproc: int, run_dir: str) -> tuple[int, int]:
        """Have the template fork this run's companion; returns the main process's ends of the
        pipes (read, write). A template that is gone leaves the main process reading EOF."""
        to_companion = os.pipe()
        from_companion = os.pipe()
        theirs = [to_companion[0], from_companion[1]]
        params = json.dumps({**req, "nproc": nproc, "run_dir": run_dir}).encode()
        try:
            if self.template_sock is not None:
                socket.send_fds(self.template_sock, [params], theirs)
        except OSError:
            pass
        finally:
            for fd in theirs:
                os.close(fd)
        return from_companion[0], to_companion[1]

    # -- process and file cleanup ----------------------------------------------------------------

    def run_pids(self) -> list[int]:
        """Every live process of the current run."""
        spared = (os.getpid(), self.template_pid)
        if self.pid_namespace:
            return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in spared]
        found: list[int] = []
        stack = [os.getpid()]
        while stack:
            pid = stack.pop()
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/children") as f:
                        children = [int(c) for c in f.read().split()]
                except OSError:
                    continue
                found.extend(c for c in children if c not in spared)  # (its companions count)
                stack.extend(children)
        return found

    def unmapped_memory_bytes(self, pids: list[int]) -> int:
        """Memory no address-space limit sees: memfd files and System V shared memory."""
        total = 0
        seen: set[tuple[int, int]] = set()
        for pid in pids:
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                link = f"/proc/{pid}/fd/{fd}"
                try:
                    if not os.readlink(link).startswith("/memfd:"):
                        continue
                    info = os.stat(link)
                except OSError:
                    continue
                if (info.st_dev, info.st_ino) not in seen:
                    seen.add((info.st_dev, info.st_ino))
                    total += info.st_blocks * 512
        if self.pid_namespace or self.dedicated_uid:
            total += _sysv_shm_bytes(os.getuid())
        return total

    def kill_all(self) -> bool:
        """SIGKILL every process of the run until none is left; True when none is."""
        for _ in range(2000):
            # Not kill(-1): the template is of the same user and outlives the runs.
            pids = self.run_pids()
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            self._reap()
            if not pids:
                return True
            time.sleep(0.0005)
        return False

    def _cleanup(self) -> bool:
        """Kill, delete and remove what the run left; False when something may remain."""
        try:
            return self._cleanup_or_raise()
        except (OSError, ValueError, RecursionError):
            return False

    def _cleanup_or_raise(self) -> bool:
        clean = self.kill_all() and self.template_alive()
        deadline = time.monotonic() + _CLEANUP_S
        clean = self._wipe(deadline) and clean
        uid = os.getuid()
        for directory in self.owned_dirs:
            try:
                with os.scandir(directory) as listing:
                    entries = list(listing)
            except OSError:
                continue
            for entry in entries:
                if entry.path == self.base_dir:
                    continue
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid == uid:
                        clean = _remove(entry.path, deadline) and clean
        if self.pid_namespace or self.dedicated_uid:
            self.libc.remove_sysv_ipc(uid)
        return clean

    def _wipe(self, deadline: float = float("inf")) -> bool:
        clean = True
        for directory in [self.base_dir, *self.wipe_dirs]:
            clean = self._wipe_dir(directory, deadline) and clean
        for path, ids in self.kept_ids.items():
            try:
                info = os.stat(path)
            except OSError:
                return False
            if (info.st_dev, info.st_ino) != ids:  # moved away: the worker is replaced
                return False
        return clean

    def _wipe_dir(self, directory: str, deadline: float) -> bool:
        """Delete what is in ``directory`` but the kept binds and the directories above them."""
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        clean = True
        for name in names:
            path = os.path.join(directory, name)
            if path in self.keep:
                continue
            if any(kept.startswith(path + "/") for kept in self.keep):
                clean = self._wipe_dir(path, deadline) and clean
            else:
                clean = _remove(path, deadline) and clean
        return clean


def _remove(path: str, deadline: float = float("inf")) -> bool:
    """Delete a file or a directory tree the run may have made unreadable or absurdly deep.

    Walks by ``chdir`` with relative names, so neither the recursion limit nor PATH_MAX stops
    it; all of the run's processes are dead by then, so nothing swaps a directory for a link.
    Returns True when ``path`` is gone, False on failure or past ``deadline`` (monotonic): a
    worker left with millions of files is cheaper to replace than to clean.
    """
    try:
        if not os.path.isdir(path) or os.path.islink(path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return True
        saved = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.chdir(os.path.dirname(path) or ".")
            names = [os.path.basename(path)]
            with contextlib.suppress(OSError):
                os.chmod(names[0], 0o700)
            os.chdir(names[0])
            while names:
                subdir = None
                if time.monotonic() > deadline:
                    return False
                with os.scandir(".") as entries:
                    for entry in entries:
                        if entry.is_dir(follow_symlinks=False):
                            subdir = entry.name
                            break
                        os.unlink(entry.name)
                if subdir is not None:
                    with contextlib.suppress(OSError):
                        os.chmod(subdir, 0o700)
                    os.chdir(subdir)
                    names.append(subdir)
                else:
                    os.chdir("..")
                    os.rmdir(names.pop())
        finally:
            os.fchdir(saved)
            os.close(saved)
    except OSError:
        return False
    return not os.path.lexists(path)


def process_status(pid: str | int) -> tuple[int, str, int] | None:
    """Real uid, state letter and thread count of a process from /proc/<pid>/status (whose
    fields, unlike the owner of /proc/<pid>, are right for non-dumpable processes too); None
    when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["Uid"].split()[0]), fields["State"].split()[0], int(fields["Threads"])
    except (OSError, KeyError, IndexError, ValueError):
        return None


def _tasks_of_uid(uid: int) -> int:
    """Threads of ``uid`` on the machine: RLIMIT_NPROC counts them all (shared-user fallback)."""
    count = 0
    for pid in os.listdir("/proc"):
        status = process_status(pid) if pid.isdigit() else None
        if status is not None and status[0] == uid:
            count += status[2]
    return count


def _sysv_shm_bytes(uid: int) -> int:
    """Resident bytes of the System V shared memory segments ``uid`` owns."""
    return sum(int(row.get("rss", 0)) for row in _sysv_rows("shm", uid))


def _run_memory_bytes(pids: list[int]) -> int:
    """Proportional set size summed over processes (resident size where smaps is closed)."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
            continue
        except (OSError, ValueError):
            pass
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/statm") as f:
            total += int(f.read().split()[1]) * page
    return total


class _Supervisor:
    """Feeds stdin, collects capped output and enforces the clock for one forked child."""

    def __init__(
        self,
        zygote: _Zygote,
        pid: int,
        req: dict[str, Any],
        *,
        stdin_w: int,
        stdin: bytes,
        out_r: int,
        err_r: int,
        started: float,
    ) -> None:
        self.zygote = zygote
        self.pid = pid
        self.req = req
        self.started = started
        self.deadline = started + float(req["timeout_s"])
        self.cap = int(req["output_bytes"])
        self.stdin = memoryview(stdin)
        self.stdin_w: int | None = stdin_w
        self.streams: dict[int, bytearray] = {out_r: bytearray(), err_r: bytearray()}
        self.out_r, self.err_r = out_r, err_r
        self.truncated = {out_r: False, err_r: False}
        self.reason: str | None = None
        self.wait_status: int | None = None
        self.rusage: Any = None
        self.ended: float | None = None

    def supervise(self) -> dict[str, Any]:
        """Wait for the end of the run (exit, clock, a limit), kill what is left, report."""
        poller = select.poll()
        pidfd = None
        with contextlib.suppress(AttributeError, OSError):  # pidfd: Linux 5.3+
            pidfd = os.pidfd_open(self.pid)
            poller.register(pidfd, select.POLLIN)
        for fd in self.streams:
            os.set_blocking(fd, False)
            poller.register(fd, select.POLLIN)
        poller.register(0, select.POLLIN)  # the parent sends nothing during a run: input = EOF
        if self.stdin and self.stdin_w is not None:
            os.set_blocking(self.stdin_w, False)
            poller.register(self.stdin_w, select.POLLOUT)
        else:
            self._close_stdin(poller)
        next_watch = time.monotonic() + _TICK_S
        open_streams = set(self.streams)
        try:
            while self.wait_status is None:
                now = time.monotonic()
                if now >= self.deadline:
                    self._stop("wall_time")
                    break
                if now >= next_watch:
                    next_watch = now + _TICK_S
                    over = self._over_limit()
                    if over is not None:
                        self._stop(over)
                        break
                wait_s = min(self.deadline, next_watch) - now
                if pidfd is None and not open_streams:
                    wait_s = min(wait_s, 0.001)  # no exit notification: poll for it
                for fd, _events in poller.poll(max(wait_s, 0.0) * 1000):
                    if fd == 0:
                        self._stop("worker_lost: the pool went away")
                        self.zygote.kill_all()
                        os._exit(0)
                    if fd == self.stdin_w:
                        self._feed_stdin(poller)
                    elif fd in open_streams and not self._read(fd):
                        poller.unregister(fd)
                        open_streams.discard(fd)
                if self.reason is not None:
                    break
                self._poll_exit()
            self.zygote.kill_all()
            self._drain(poller, open_streams)
        finally:
            self._close_stdin(poller)
            for fd in self.streams:
                os.close(fd)
            if pidfd is not None:
                os.close(pidfd)
        return self._outcome()

    def _drain(self, poller: Any, open_streams: set[int]) -> None:
        """Read what the dead writers left in the pipes, up to end of file (bounded in time)."""
        give_up = time.monotonic() + 1.0
        while open_streams and time.monotonic() < give_up:
            for fd, _events in poller.poll(100):
                if fd in open_streams and not self._read(fd):
                    poller.unregister(fd)
                    open_streams.discard(fd)

    def _close_stdin(self, poller: Any) -> None:
        if self.stdin_w is not None:
            with contextlib.suppress(KeyError, ValueError):
                poller.unregister(self.stdin_w)
            os.close(self.stdin_w)
            self.stdin_w = None

    def _feed_stdin(self, poller: Any) -> None:
        assert self.stdin_w is not None
        try:
            written = os.write(self.stdin_w, self.stdin[: 1 << 16])
        except BlockingIOError:
            return
        except OSError:  # the code closed its stdin (EPIPE): the rest is not wanted
            written = len(self.stdin)
        self.stdin = self.stdin[written:]
        if not self.stdin:
            self._close_stdin(poller)

    def _read(self, fd: int) -> bool:
        """Read what is there; False at end of file."""
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        buffer = self.streams[fd]
        room = self.cap - len(buffer)
        buffer += chunk[:room]
        if len(chunk) > room:
            self.truncated[fd] = True
            if self.reason is None and self.wait_status is None:
                self._stop("output_limit")
        return True

    def _poll_exit(self) -> None:
        if self.wait_status is None:
            self._wait(os.WNOHANG)

    def _wait(self, flags: int) -> None:
        try:
            pid, status, rusage = os.wait4(self.pid, flags)
        except ChildProcessError:
            self.wait_status = 0
            return
        if pid == self.pid:
            self.wait_status, self.rusage = status, rusage
            self.ended = time.monotonic()

    def _over_limit(self) -> str | None:
        """The limit ("memory" or "processes") the whole run exceeds, if any.

        RLIMIT_AS binds each process, not their sum, nor memory outside address spaces; and
        RLIMIT_NPROC does not bind root (a fallback without a spare uid).
        """
        pids = self.zygote.run_pids()
        if len(pids) > int(self.req["processes"]):
            return "processes"
        total = self.zygote.unmapped_memory_bytes(pids)
        if len(pids) > 1:  # one process alone is held by its address-space limit
            total += _run_memory_bytes(pids)
        return "memory" if total > int(self.req["memory_bytes"]) else None

    def _stop(self, reason: str) -> None:
        """Kill the run for ``reason``; the main process's status is collected first."""
        self.reason = reason
        self.ended = time.monotonic()
        if self.wait_status is None:
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(OSError):
                    kill(self.pid, signal.SIGKILL)
            self._wait(0)
        self.zygote.kill_all()

    def _outcome(self) -> dict[str, Any]:
        ended = self.ended if self.ended is not None else time.monotonic()
        cpu_s = 0.0
        max_rss_kb = 0
        if self.rusage is not None:
            cpu_s = self.rusage.ru_utime + self.rusage.ru_stime
            max_rss_kb = self.rusage.ru_maxrss
        status_code = self.wait_status or 0
        returncode: int | None = None
        if os.WIFEXITED(status_code):
            returncode = os.WEXITSTATUS(status_code)
        elif os.WIFSIGNALED(status_code):
            returncode = -os.WTERMSIG(status_code)
        reason = self.reason
        if reason == "wall_time":
            status = "timeout"
        elif reason is not None:
            status = "killed"
        elif returncode is not None and returncode >= 0:
            status = "ok" if returncode == 0 else "error"
            if returncode == 1 and _ends_in_memory_error(self.streams[self.err_r]):
                reason = "memory"  # the address-space limit, met by the interpreter
        else:
            signum = -(returncode or -signal.SIGKILL)
            cpu_limit = float(self.req["cpu_s"])
            if signum == signal.SIGXCPU or (signum == signal.SIGKILL and cpu_s >= cpu_limit):
                status, reason = "timeout", "cpu_time"
            else:
                status, reason = "killed", f"signal {signal.Signals(signum).name}"
        return {
            "status": status,
            "returncode": returncode,
            "reason": reason,
            "duration_s": ended - self.started,
            "cpu_s": cpu_s,
            "max_rss_kb": max_rss_kb,
            "stdout_truncated": self.truncated[self.out_r],
            "stderr_truncated": self.truncated[self.err_r],
            "stdout": bytes(self.streams[self.out_r]),
            "stderr": bytes(self.streams[self.err_r]),
        }


def _ends_in_memory_error(stderr: bytes | bytearray) -> bool:
    """Whether the run's last words are an uncaught MemoryError's traceback."""
    lines = stderr.rstrip().rsplit(b"\n", 1)
    return lines[-1] == b"MemoryError" or lines[-1].startswith(b"MemoryError: ")


# ---------------------------------------------------------------------------------------------
# The forked child: becomes the run
# ---------------------------------------------------------------------------------------------


def _child(
    zygote: _Zygote,
    req: dict[str, Any],
    *,
    nproc: int,
    run_dir: str,
    main_path: str,
    stdio: tuple[int, int, int],
    companion: tuple[int, ...] = (),
) -> NoReturn:
    try:
        os.setsid()
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
        _move_fds(companion, COMPANION_FDS[: len(companion)])
        # The zygote's pipes and everything else.
        os.closerange(3 + len(companion), os.sysconf("SC_OPEN_MAX"))
        _reset_signals()
        zygote.libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if not req.get("private_main"):
            zygote.libc.prctl(_PR_SET_DUMPABLE, 1)  # its own /proc entries, as in any process
        # else it stays non-dumpable, like the zygote: a trusted main process whose children
        # run untrusted code (their exec makes them dumpable again, and the filter keeps them so)
        _set_limits(req, nproc)
        os.chdir(run_dir)
        os.umask(0o022)
        _reset_interpreter(main_path, run_dir)
        if zygote.seccomp is not None:
            zygote.seccomp.load(zygote.libc)
    except BaseException as exc:  # noqa: BLE001  # never run the code without its limits
        with contextlib.suppress(BaseException):
            os.write(2, f"sandbox set-up failed: {exc!r}\n".encode())
        os._exit(125)
    os._exit(_run_main(main_path))


def _move_fds(fds: tuple[int, ...], targets: tuple[int, ...]) -> None:
    """Put ``fds`` at ``targets`` (inheritable), whatever numbers they had."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10 + max(targets, default=0)) for fd in fds]
    for fd, target in zip(high, targets, strict=True):
        os.dup2(fd, target)
        os.close(fd)


def _companion(
    zygote: _Zygote, seccomp: _SeccompFilter | None, req: dict[str, Any], fds: tuple[int, int]
) -> NoReturn:
    """A forked companion becomes its run's second process, then runs what it is sent."""
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for target in (0, 1, 2):
            os.dup2(null, target)
        _move_fds(fds, COMPANION_FDS)
        os.closerange(max(COMPANION_FDS) + 1, os.sysconf("SC_OPEN_MAX"))
        _reset_signals()
        zygote.libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        zygote.libc.prctl(_PR_SET_DUMPABLE, 1)  # visible to the supervisor's memory watch
        if os.geteuid() == 0:  # root without a uid of its own: no capability (CAP_SYS_PTRACE)
            zygote.libc.drop_capabilities()
        _set_limits(req, int(req["nproc"]))
        run_dir = str(req["run_dir"])
        os.chdir(run_dir)
        os.umask(0o022)
        _reset_interpreter(os.path.join(run_dir, COMPANION_ARGV0), run_dir)
        sys.argv[:] = [COMPANION_ARGV0]
        if seccomp is not None:
            seccomp.load(zygote.libc)
    except BaseException:  # noqa: BLE001  # never run the code without its limits
        os._exit(125)
    prefix = _read_exact(COMPANION_FDS[0], _LENGTH.size)
    length = _LENGTH.unpack(prefix)[0] if prefix else 0
    source = (
        _read_exact(COMPANION_FDS[0], length) if 0 < length <= MAX_COMPANION_PROGRAM_BYTES else None
    )
    if source is None:
        os._exit(0)  # the main process sent no program
    os._exit(_run_code(source, COMPANION_ARGV0))


def _reset_signals() -> None:
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            signal.signal(signum, signal.SIG_DFL)
    # What a fresh interpreter has: KeyboardInterrupt on SIGINT, broken pipes and big files as
    # exceptions rather than deaths.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def _set_limits(req: dict[str, Any], nproc: int) -> None:
    import resource

    cpu_s = int(req["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))  # SIGXCPU, then SIGKILL
    hard_limits = {
        resource.RLIMIT_AS: int(req["memory_bytes"]),
        resource.RLIMIT_FSIZE: int(req["file_bytes"]),
        resource.RLIMIT_NPROC: nproc,
        resource.RLIMIT_NOFILE: int(req["open_files"]),
        resource.RLIMIT_CORE: 0,
        resource.RLIMIT_MSGQUEUE: 0,
    }
    for limit, value in hard_limits.items():
        # Soft = hard: the code may lower a limit but never raise it back.
        resource.setrlimit(limit, (value, value))


def _reset_interpreter(main_path: str, run_dir: str) -> None:
    import atexit
    import builtins
    import types

    atexit._clear()  # the zygote's handlers are not the run's
    main = types.ModuleType("__main__")
    main.__file__ = main_path
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    main.__cached__ = None  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    sys.argv[:] = [main_path]
    sys.path.insert(0, run_dir)
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile.tempdir = None  # type: ignore[attr-defined]  # computed afresh from TMPDIR


def _run_main(main_path: str) -> int:
    """Execute ``main.py`` as the interpreter would; returns the exit status."""
    try:
        with open(main_path, "rb") as f:
            source = f.read()
    except BaseException as exc:  # noqa: BLE001  # the code's own doing (it is its directory)
        _report(exc.with_traceback(None))
        return _finish(1)
    return _run_code(source, main_path)


def _run_code(source: bytes, filename: str) -> int:
    """Execute ``source`` in ``__main__`` as the interpreter would; returns the exit status."""
    code = 0
    main = sys.modules["__main__"]
    try:
        compiled = compile(source, filename, "exec")
    except BaseException as exc:  # noqa: BLE001  # a syntax error: the code's own failure
        _report(exc.with_traceback(None))
        return _finish(1)
    try:
        exec(compiled, main.__dict__)
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException as exc:  # noqa: BLE001  # uncaught in the code: exit status 1
        traceback = exc.__traceback__
        _report(exc.with_traceback(traceback.tb_next if traceback else None))  # hide our frame
        code = 1
    return _finish(code)


def _report(exc: BaseException) -> None:
    """Print an uncaught exception as the interpreter does (through ``sys.excepthook``)."""
    try:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    except BaseException:  # noqa: BLE001  # a broken hook: fall back to the default printer
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exception(exc, file=sys.stderr)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    with contextlib.suppress(BaseException):
        print(exc.code, file=sys.stderr)
    return 1


def _finish(code: int) -> int:
    """Interpreter shutdown: join threads, run atexit handlers, flush the standard streams."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except SystemExit as exc:
            code = _exit_code(exc)
        except BaseException:  # noqa: BLE001  # as at interpreter exit: reported, status 1
            code = code or 1
    import atexit

    try:
        atexit._run_exitfuncs()
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:  # noqa: BLE001  # atexit already printed it
        code = code or 1
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except BaseException:  # noqa: BLE001  # CPython exits 120 when the final flush fails
            code = code or 120
    return code


def main() -> None:
    """Entry point inside the sandbox: ``python -I -S -B -c SOURCE CONFIG_JSON``."""
    zygote = _Zygote(json.loads(sys.argv[1]))
    zygote.start()
    zygote.serve()


if __name__ == "__main__":
    main()
