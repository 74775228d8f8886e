"""One sandbox worker: a zygote process (inside bubblewrap, or not) and the pipe to it.

Owned by :class:`aflowrl.sandbox.pool.SandboxPool`, which runs every worker on its own event loop:
start, send runs one at a time, stop. A worker that misbehaves in any way (exits, stops answering,
breaks the protocol) raises :class:`WorkerLost` and is replaced; it is never trusted again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import subprocess
from typing import Any, get_args

from aflowrl.sandbox import _zygote
from aflowrl.sandbox._launch import Plan, UidLease
from aflowrl.sandbox.errors import SandboxUnavailableError
from aflowrl.sandbox.result import SandboxLimits, Status

logger = logging.getLogger(__name__)

_EXIT_WAIT_S = 1.0
"""How long a stopped worker may take to clean up after itself before it is killed."""

GRACE_S = 5.0
"""Time past a run's own timeout for the zygote to kill, clean up and answer before it is killed."""


_STATUSES = frozenset(get_args(Status))
_RESULT_KEYS = frozenset(
    {"returncode", "reason", "duration_s", "cpu_s", "max_rss_kb", "stdout_truncated"}
    | {"stderr_truncated", "dirty"}
)


class WorkerLost(Exception):
    """The worker died or stopped answering during a run; ``reason`` says how."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Worker:
    """A started zygote; ``run`` one request at a time."""

    def __init__(self, plan: Plan, name: str) -> None:
        self.plan = plan
        self.name = name
        self.runs = 0
        self.seccomp = False
        self._lease: UidLease | None = None
        self._base_dir: str | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=20)
        self._stderr_task: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        """Host pid of the worker process (bwrap or the zygote)."""
        return self._proc.pid if self._proc else None

    async def start(self, timeout_s: float) -> None:
        """Start the zygote and wait for its ready frame; raises SandboxUnavailableError."""
        uid = None
        if self.plan.needs_uid:
            self._lease = UidLease.acquire()
            uid = self._lease.uid
        self._base_dir = self.plan.make_base_dir(uid)
        try:
            argv, kwargs = await asyncio.to_thread(self.plan.command, uid, self._base_dir)
            self._proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                limit=1 << 20,
                **kwargs,
            )
            self._stderr_task = asyncio.get_running_loop().create_task(self._log_stderr())
            ready, _ = await asyncio.wait_for(self._read_frame(max_payload=0), timeout_s)
            self.seccomp = bool(ready.get("seccomp"))
        except SandboxUnavailableError:
            await self.stop()
            raise
        except (OSError, subprocess.SubprocessError, WorkerLost, TimeoutError) as exc:
            await self.stop()
            detail = " | ".join(self._stderr_tail) or str(exc) or type(exc).__name__
            raise SandboxUnavailableError(
                f"{self.plan.kind} sandbox worker did not start: {detail}"
            ) from exc

    async def run(
        self, code: bytes, stdin: bytes, limits: SandboxLimits, private_main: bool = False
    ) -> tuple[dict[str, Any], bytes, bytes]:
        """Send one run and return the zygote's result header, stdout and stderr."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.returncode is not None:
            raise WorkerLost("worker is not running")
        self.runs += 1
        request = {
            "timeout_s": limits.timeout_s,
            "cpu_s": limits.cpu_s,
            "memory_bytes": limits.memory_mb << 20,
            "file_bytes": limits.max_file_mb << 20,
            "processes": limits.max_processes,
            "open_files": limits.max_open_files,
            "output_bytes": limits.max_output_bytes,
            "private_main": private_main,
        }
        try:
            proc.stdin.write(_zygote.encode_frame(request, code, stdin))
            await proc.stdin.drain()
        except (ConnectionError, OSError) as exc:
            raise WorkerLost(f"worker exited ({exc})") from exc
        try:
            header, payloads = await asyncio.wait_for(
                self._read_frame(max_payload=limits.max_output_bytes),
                limits.timeout_s + GRACE_S,
            )
        except TimeoutError:
            raise WorkerLost("worker stopped answering") from None
        if len(payloads) != 2 or header.get("status") not in _STATUSES:
            raise WorkerLost(f"protocol error: bad result {header!r}")
        missing = _RESULT_KEYS - header.keys()
        if missing:
            raise WorkerLost(f"protocol error: result lacks {sorted(missing)}")
        return header, payloads[0], payloads[1]

    async def stop(self) -> None:
        """Kill the worker and everything in it, then clean up its user and files."""
        proc = self._proc
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()  # end of input: the zygote kills its run and exits
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), _EXIT_WAIT_S)
            if proc.returncode is None:
                # The worker leads its own process group. (Not ``proc.kill()``: it polls, and
                # reaping here would race the event loop's child watcher.)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            if proc.stdout is not None:  # let the transport see end of file and close
                with contextlib.suppress(asyncio.LimitOverrunError, ValueError):
                    await asyncio.wait_for(proc.stdout.read(), 5.0)
        if self._stderr_task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stderr_task, 5.0)
        await self.plan.cleanup(self._lease.uid if self._lease else None, self._base_dir)
        if self._lease is not None:
            self._lease.release()
        self._proc = None
        self._base_dir = None
        self._lease = None

    async def _read_frame(self, max_payload: int) -> tuple[dict[str, Any], list[bytes]]:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        try:
            prefix = await proc.stdout.readexactly(4)
            raw = await proc.stdout.readexactly(_zygote.header_length(prefix))
            header, sizes = _zygote.decode_header(raw)
            if any(size > max_payload for size in sizes):
                raise ValueError(f"payload sizes {sizes} exceed {max_payload}")
            payloads = [await proc.stdout.readexactly(size) for size in sizes]
        except asyncio.IncompleteReadError:
            await asyncio.sleep(0)  # let the stderr reader log why
            raise WorkerLost("worker exited") from None
        except ValueError as exc:
            raise WorkerLost(f"protocol error: {exc}") from None
        return header, payloads

    async def _log_stderr(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stderr is not None
        while True:
            try:
                line = await proc.stderr.readline()
            except ValueError:  # a line over the stream limit
                line = b"(line too long)\n"
            if not line:
                return
            text = line.decode(errors="replace").rstrip()
            self._stderr_tail.append(text)
            logger.warning("sandbox worker %s: %s", self.name, text)
