"""The sandbox's front door: a pool of pre-started workers, and ``run_python`` / ``arun_python``.

Called by the code benchmarks' scorers (HumanEval, MBPP hidden tests), the Programmer and Test
workflow operators and the environment service. A :class:`SandboxPool` owns ``size`` workers (see
:mod:`aflowrl.sandbox._zygote`) and a private event loop on a daemon thread, so the same pool
serves synchronous callers and coroutines on any event loop; at most ``size`` runs execute at
once and the rest wait their turn. A worker is replaced after any run that may have damaged it
(lost, unclean, or ``max_runs_per_worker`` reached); generated code never runs in this process.

The process-wide default pool (``default_pool()``) starts on first use with the mode of
$AFLOWRL_SANDBOX and closes at exit.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import sys
import threading
from collections.abc import Coroutine
from typing import Any, Self, TypedDict, TypeVar, Unpack

from aflowrl import envs
from aflowrl.sandbox._launch import ALL_PROTECTIONS, Plan, candidate_plans, harden_caller
from aflowrl.sandbox._worker import Worker, WorkerLost
from aflowrl.sandbox.errors import (
    SandboxClosedError,
    SandboxLimitError,
    SandboxUnavailableError,
)
from aflowrl.sandbox.result import Mode, SandboxLimits, SandboxResult

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

MAX_CODE_BYTES = 16 << 20
"""Largest program accepted (UTF-8 bytes)."""
MAX_STDIN_BYTES = 64 << 20
"""Largest standard input accepted."""

_RESTART_ATTEMPTS = 3


class SandboxPool:
    """Pre-started sandbox workers with bounded concurrency; a context manager (sync or async).

    ``mode``: "auto" (bubblewrap where it runs, else rlimits), "bwrap" (fail without it) or
    "rlimits"; None reads $AFLOWRL_SANDBOX. ``size``: workers, i.e. runs at once (default: CPU
    count, at least 2). ``python``: interpreter of the code (default: this one, with its
    packages). ``tmpfs_mb``: size of each worker's private /tmp (bubblewrap; /dev/shm gets a
    quarter). ``max_runs_per_worker``: runs before a worker is replaced anyway.
    """

    def __init__(
        self,
        size: int | None = None,
        *,
        mode: str | None = None,
        python: str | None = None,
        max_runs_per_worker: int = 1000,
        tmpfs_mb: int = 64,
        start_timeout_s: float = 60.0,
    ) -> None:
        self.size = size if size is not None else max(2, os.cpu_count() or 1)
        if not 1 <= self.size <= 1024:
            raise SandboxLimitError(f"must lie in [1, 1024], got {self.size}", field="size")
        if not max_runs_per_worker >= 1:
            raise SandboxLimitError("must be at least 1", field="max_runs_per_worker")
        if not 4 <= tmpfs_mb <= 1 << 20:
            raise SandboxLimitError(f"must lie in [4, {1 << 20}]", field="tmpfs_mb")
        self._setting = (mode if mode is not None else envs.AFLOWRL_SANDBOX).lower()
        if self._setting not in ("auto", "bwrap", "rlimits"):
            raise SandboxLimitError(
                f"must be 'auto', 'bwrap' or 'rlimits', got {self._setting!r}",
                field="mode" if mode is not None else "AFLOWRL_SANDBOX",
            )
        self._python = python or sys.executable
        if not self._python:
            raise SandboxUnavailableError("no Python interpreter path for sandboxed code")
        self._max_runs = max_runs_per_worker
        self._tmpfs_mb = tmpfs_mb
        self._start_timeout_s = start_timeout_s
        self._plan: Plan | None = None
        self._protections: tuple[str, ...] = ()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._idle: asyncio.Queue[Worker | None] | None = None
        self._workers: set[Worker] = set()
        self._alive = 0
        self._failure: Exception | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._closed = False
        self._owner_pid = os.getpid()
        self._lock = threading.RLock()  # start() submits while holding it

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the workers (blocking); raises SandboxUnavailableError when none can start."""
        with self._lock:
            if self._closed:
                raise SandboxClosedError("sandbox pool is closed")
            if self._loop is not None:
                return self
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="aflowrl-sandbox", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
            try:
                self._call(self._astart())
            except BaseException:
                self._shutdown_loop()
                raise
            atexit.register(self.close)  # a pool left open still cleans up its users and files
        return self

    def close(self) -> None:
        """Kill every worker and stop the pool; runs still in flight end as ``killed``."""
        with self._lock:
            if self._closed:
                return
            if self._loop is None or os.getpid() != self._owner_pid:
                self._closed = True
                return
            try:
                self._call(self._aclose())  # marks the pool closed on its own loop
            finally:
                self._closed = True
                self._shutdown_loop()
                atexit.unregister(self.close)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *_exc: object) -> None:
        await asyncio.to_thread(self.close)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def mode(self) -> Mode:
        """Isolation mode of the started pool."""
        return self._started_plan().mode

    @property
    def protections(self) -> tuple[str, ...]:
        """Protections active for every run of the started pool."""
        self._started_plan()
        return self._protections

    # -- runs ------------------------------------------------------------------------------------

    def run(
        self,
        code: str,
        *,
        limits: SandboxLimits | None = None,
        stdin: str | bytes | None = None,
        private_main: bool = False,
    ) -> SandboxResult:
        """Run ``code`` in a worker, blocking until it ends.

        ``private_main``: the run's main process stays non-dumpable, so the other processes of
        the run (same uid) cannot ptrace it nor read its memory, file descriptors or environment
        through /proc (they can still signal it), and it gets a companion process connected to
        its fds 3 (read) and 4 (write), which runs the program it first writes there (see
        ``_zygote``). For a trusted program that runs untrusted code out of its own reach (the
        code benchmarks' verdict driver, ``benchmarks._verdict``).
        """
        if threading.current_thread() is self._thread:
            raise RuntimeError("SandboxPool.run called from the pool's own thread")
        limits = limits or SandboxLimits()
        return self._call(self._arun(*_encode(code, stdin), limits, private_main))

    async def arun(
        self,
        code: str,
        *,
        limits: SandboxLimits | None = None,
        stdin: str | bytes | None = None,
        private_main: bool = False,
    ) -> SandboxResult:
        """Run ``code`` in a worker; cancelling the caller kills the run (see :meth:`run`)."""
        limits = limits or SandboxLimits()
        future = self._submit(self._arun(*_encode(code, stdin), limits, private_main))
        return await asyncio.wrap_future(future)

    # -- internals (the pool's loop) -------------------------------------------------------------

    def _started_plan(self) -> Plan:
        if self._plan is None:
            raise SandboxClosedError("sandbox pool is not started")
        return self._plan

    def _submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        with self._lock:  # never onto a loop that close() is stopping
            if os.getpid() != self._owner_pid:
                coro.close()
                raise SandboxClosedError("sandbox pool belongs to the parent of this process")
            if self._loop is None or self._closed:
                coro.close()
                raise SandboxClosedError("sandbox pool is not running (start it, or use `with`)")
            return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return self._submit(coro).result()

    def _shutdown_loop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
        self._loop = self._thread = None

    async def _astart(self) -> None:
        self._idle = asyncio.Queue()
        reasons = []
        for plan in candidate_plans(self._setting, self._python, self._tmpfs_mb):
            first = Worker(plan, "0")
            try:
                await first.start(self._start_timeout_s)
            except SandboxUnavailableError as exc:
                if plan.mode == "bwrap":
                    works, said = await plan.namespaces_work()
                    if works:  # installed and allowed, but our worker fails in it: a bug to fix
                        raise SandboxUnavailableError(
                            f"bubblewrap runs here, but the sandbox worker does not start in it: "
                            f"{exc}"
                        ) from None
                    logger.warning(
                        "sandbox: bubblewrap is installed but cannot make namespaces here (%s); "
                        "trying the next isolation mode",
                        said,
                    )
                else:
                    logger.info("sandbox: %s unusable here: %s", plan.kind, exc)
                reasons.append(str(exc))
                continue
            self._plan = plan
            self._protections = plan.protections(first.seccomp)
            harden_caller(plan)
            self._adopt(first)
            break
        if self._plan is None:
            raise SandboxUnavailableError(
                f"no sandbox can start (AFLOWRL_SANDBOX={self._setting}): " + "; ".join(reasons)
            )
        others = [Worker(self._plan, str(i)) for i in range(1, self.size)]
        results = await asyncio.gather(
            *(w.start(self._start_timeout_s) for w in others), return_exceptions=True
        )
        for worker, outcome in zip(others, results, strict=True):
            if isinstance(outcome, BaseException):
                await self._aclose()
                raise outcome
            self._adopt(worker)
        plan = self._plan
        missing = [p for p in ALL_PROTECTIONS if p not in self.protections]
        logger.info(
            "sandbox pool ready: mode=%s (%s), %d workers, protections: %s",
            plan.mode,
            plan.kind,
            self.size,
            ", ".join(self.protections),
        )
        if plan.mode != "bwrap" or "unprivileged_user" not in self.protections:
            logger.warning(
                "sandbox runs with reduced isolation (%s); missing: %s",
                plan.kind,
                ", ".join(missing),
            )

    def _adopt(self, worker: Worker) -> None:
        assert self._idle is not None
        self._workers.add(worker)
        self._alive += 1
        self._idle.put_nowait(worker)

    async def _acquire(self) -> Worker:
        assert self._idle is not None
        worker = None if self._failure is not None else await self._idle.get()
        if worker is None:
            self._idle.put_nowait(None)  # wake the next waiter too
            assert self._failure is not None
            raise type(self._failure)(str(self._failure))
        return worker

    async def _arun(
        self, code_bytes: bytes, stdin_bytes: bytes, limits: SandboxLimits, private_main: bool
    ) -> SandboxResult:
        plan = self._started_plan()
        worker = await self._acquire()
        try:
            header, out, err = await worker.run(code_bytes, stdin_bytes, limits, private_main)
        except WorkerLost as lost:
            self._replace(worker)
            reason = "sandbox pool closed" if self._closed else lost.reason
            logger.warning("sandbox worker %s lost: %s", worker.name, reason)
            return SandboxResult(
                status="killed",
                stdout="",
                stderr="",
                duration_s=0.0,
                reason=f"worker_lost: {reason}",
                mode=plan.mode,
                protections=self._protections,
            )
        except BaseException:  # cancelled mid-run: the worker's state is unknown
            self._replace(worker)
            raise
        if header.get("dirty") or worker.runs >= self._max_runs:
            self._replace(worker)
        else:
            assert self._idle is not None
            self._idle.put_nowait(worker)
        return SandboxResult(
            status=header["status"],
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            duration_s=float(header["duration_s"]),
            returncode=header["returncode"],
            reason=header["reason"],
            truncated=bool(header["stdout_truncated"] or header["stderr_truncated"]),
            cpu_s=float(header["cpu_s"]),
            max_rss_mb=float(header["max_rss_kb"]) / 1024,
            mode=plan.mode,
            protections=self._protections,
        )

    def _replace(self, worker: Worker) -> None:
        task = asyncio.get_running_loop().create_task(self._restart(worker))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _restart(self, old: Worker) -> None:
        """Replace ``old``: its successor starts while it is being killed and cleaned up."""
        self._workers.discard(old)
        self._alive -= 1
        stopping = asyncio.get_running_loop().create_task(self._stop(old))
        try:
            if not self._closed:
                await self._start_successor(old)
        finally:
            await stopping

    async def _stop(self, worker: Worker) -> None:
        try:
            await worker.stop()
        except OSError as exc:  # leftovers belong to its reserved uid, never reused meanwhile
            logger.error("sandbox worker %s did not clean up: %s", worker.name, exc)

    async def _start_successor(self, old: Worker) -> None:
        error: Exception | None = None
        for attempt in range(_RESTART_ATTEMPTS):
            worker = Worker(old.plan, old.name)
            try:
                await worker.start(self._start_timeout_s)
            except SandboxUnavailableError as exc:
                error = exc
                logger.warning("sandbox worker %s failed to restart: %s", old.name, exc)
                await asyncio.sleep(0.2 * 2**attempt)
                continue
            if self._closed:
                await self._stop(worker)
                return
            self._adopt(worker)
            return
        if self._alive == 0 and self._idle is not None:
            self._failure = SandboxUnavailableError(f"every sandbox worker failed: {error}")
            self._idle.put_nowait(None)

    async def _aclose(self) -> None:
        self._closed = True
        if self._failure is None:
            self._failure = SandboxClosedError("sandbox pool is closed")
        if self._idle is not None:
            self._idle.put_nowait(None)
        workers = list(self._workers)
        self._workers.clear()
        await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)


def _encode(code: str, stdin: str | bytes | None) -> tuple[bytes, bytes]:
    if not isinstance(code, str):
        raise SandboxLimitError(f"must be a str, got {type(code).__name__}", field="code")
    try:
        code_bytes = code.encode()
    except UnicodeEncodeError as exc:
        raise SandboxLimitError(f"is not encodable as UTF-8: {exc}", field="code") from None
    if len(code_bytes) > MAX_CODE_BYTES:
        raise SandboxLimitError(f"exceeds {MAX_CODE_BYTES} bytes", field="code")
    if stdin is None:
        stdin_bytes = b""
    elif isinstance(stdin, str):
        stdin_bytes = stdin.encode("utf-8", "surrogateescape")
    elif isinstance(stdin, bytes | bytearray | memoryview):
        stdin_bytes = bytes(stdin)
    else:
        raise SandboxLimitError(f"must be str or bytes, got {type(stdin).__name__}", field="stdin")
    if len(stdin_bytes) > MAX_STDIN_BYTES:
        raise SandboxLimitError(f"exceeds {MAX_STDIN_BYTES} bytes", field="stdin")
    return code_bytes, stdin_bytes


# -- the process-wide default pool --------------------------------------------------------------


class _DefaultPool:
    """Holder of the process-wide pool: started on first use, closed at exit, forgotten by a
    forked child (the parent's pool thread does not exist there)."""

    def __init__(self) -> None:
        self.pool: SandboxPool | None = None
        self.lock = threading.Lock()

    def get(self) -> SandboxPool:
        with self.lock:
            if self.pool is None or self.pool.closed:
                self.pool = SandboxPool().start()
            return self.pool

    def close(self) -> None:
        with self.lock:
            if self.pool is not None:
                self.pool.close()

    def forget(self) -> None:
        self.pool = None
        self.lock = threading.Lock()


_DEFAULT = _DefaultPool()
atexit.register(_DEFAULT.close)
os.register_at_fork(after_in_child=_DEFAULT.forget)


def default_pool() -> SandboxPool:
    """The process-wide pool, started on first use (mode from $AFLOWRL_SANDBOX), closed at exit."""
    return _DEFAULT.get()


def _close_default_pool() -> None:
    _DEFAULT.close()


class LimitArgs(TypedDict, total=False):
    """Keyword arguments of :func:`run_python` and :func:`arun_python` that set
    :class:`SandboxLimits` fields (defaults: that class's)."""

    timeout_s: float
    memory_mb: int
    max_output_bytes: int
    max_file_mb: int
    max_processes: int
    max_open_files: int


def run_python(
    code: str,
    *,
    stdin: str | bytes | None = None,
    pool: SandboxPool | None = None,
    private_main: bool = False,
    **limits: Unpack[LimitArgs],
) -> SandboxResult:
    """Run Python ``code`` in the sandbox and wait for it (``pool`` or the default pool).

    ``timeout_s``, ``memory_mb`` and the other limits are :class:`SandboxLimits` fields. The
    code runs as ``python main.py`` would, in an empty working directory, with ``stdin`` as its
    standard input. Its failures are statuses, never exceptions: see :class:`SandboxResult`.
    ``private_main``: see :meth:`SandboxPool.run`.
    """
    checked = SandboxLimits(**limits)
    return (pool or default_pool()).run(
        code, limits=checked, stdin=stdin, private_main=private_main
    )


async def arun_python(
    code: str,
    *,
    stdin: str | bytes | None = None,
    pool: SandboxPool | None = None,
    private_main: bool = False,
    **limits: Unpack[LimitArgs],
) -> SandboxResult:
    """:func:`run_python` for coroutines: awaits a worker of the pool (runs execute concurrently,
    at most the pool's size at once). Cancelling the awaiting task kills the run."""
    checked = SandboxLimits(**limits)
    if pool is None:
        pool = await asyncio.to_thread(default_pool)
    return await pool.arun(code, limits=checked, stdin=stdin, private_main=private_main)
