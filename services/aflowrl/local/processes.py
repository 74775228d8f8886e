"""Child processes of a local run: started, health-checked, and stopped, none left behind.

Each service runs as a child in a session (process group) of its own, so a stop reaches
everything it started (torchrun's ranks, sandbox workers), and a Ctrl-C in the terminal reaches
only the launcher, which then stops the children in order. Children are started through
:mod:`aflowrl.local._orphan_guard`, so they also die when the launcher is killed outright. Each
child's output goes to ``<name>.log``; a child that exits during start-up fails the start with
the end of its log.

::

    with ProcessGroup(log_dir) as group:
        child = group.start("rollout", [sys.executable, "-m", "aflowrl", "serve", ...], port)
        await group.wait_serving(timeout_s=300)
        ...
    # every child got SIGTERM, then SIGKILL after the grace period

Used by :mod:`aflowrl.local.launcher`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from aflowrl import envs
from aflowrl.common.client import ChannelOptions, explain_failure, make_channel
from aflowrl.local.errors import ServiceStartError

logger = logging.getLogger(__name__)


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free TCP ports (all bound at once, so none is handed out twice)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind((host, 0))
            sockets.append(sock)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class Child:
    """One started service."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    host: str = "127.0.0.1"

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 25) -> str:
        if not self.log.is_file():
            return "(no log)"
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the child's whole process group (ignored when already gone)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)


@dataclass
class ProcessGroup:
    """The children of one local run (module docstring)."""

    log_dir: Path
    grace_s: float = 25.0
    """Seconds a child gets after SIGTERM before SIGKILL."""
    channel_options: ChannelOptions = field(default_factory=ChannelOptions)
    """How health checks reach the children: the run's TLS and token (the run's clients')."""
    children: list[Child] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def start(
        self, name: str, command: Sequence[str], port: int, *, env: dict[str, str] | None = None
    ) -> Child:
        """Start ``command`` as child ``name`` (its output in ``<log_dir>/<name>.log``).

        Call from the main thread: the orphan guard ties the child to the thread that forks it.
        """
        log = self.log_dir / f"{name}.log"
        guarded = [sys.executable, "-m", "aflowrl.local._orphan_guard", str(os.getpid())]
        extra = {"PYTHONUNBUFFERED": "1", **(env or {})}
        with log.open("ab") as out:
            process = subprocess.Popen(
                [*guarded, *command],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=envs.child_environment(extra),
                start_new_session=True,
            )
        child = Child(name, process, port, log)
        self.children.append(child)
        logger.info("started %s (pid %d, port %d, log %s)", name, process.pid, port, log)
        return child

    async def wait_serving(self, timeout_s: float, children: Sequence[Child] | None = None) -> None:
        """Wait until every child's gRPC health says SERVING (all at once).

        Raises :class:`ServiceStartError` with the end of its log when a child exits first or
        is not serving within ``timeout_s``.
        """
        await asyncio.gather(*(self._wait_one(c, timeout_s) for c in (children or self.children)))

    async def _wait_one(self, child: Child, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        async with make_channel(child.target, self.channel_options) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                if not child.alive():
                    raise ServiceStartError(
                        f"{child.name} exited with status {child.process.returncode} while "
                        f"starting; the end of {child.log}:\n{child.log_tail()}"
                    )
                try:
                    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        logger.info("%s is serving on %s", child.name, child.target)
                        return
                    last = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                except aio.AioRpcError as exc:
                    last, transient = explain_failure(exc, self.channel_options.tls)
                    if not transient:
                        raise ServiceStartError(
                            f"{child.name} refused: {last}; the end of {child.log}:\n"
                            f"{child.log_tail()}"
                        ) from None
                await asyncio.sleep(0.25)
        raise ServiceStartError(
            f"{child.name} was not serving after {timeout_s:.0f}s ({last}); the end of "
            f"{child.log}:\n{child.log_tail()}"
        )

    def stop(self, child: Child, sig: int = signal.SIGTERM) -> int | None:
        """Stop one child's process group: ``sig``, then SIGKILL after the grace period."""
        return self._stop_all([child], sig)[0]

    def stop_all(self) -> None:
        """Stop every child, newest first, all within one grace period."""
        self._stop_all(list(reversed(self.children)), signal.SIGTERM)

    def _stop_all(self, children: Sequence[Child], sig: int) -> list[int | None]:
        for child in children:
            child.signal_group(sig)
        deadline = time.monotonic() + self.grace_s
        for child in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(max(0.0, deadline - time.monotonic()))
        for child in children:
            if child.alive():
                logger.warning("%s did not stop within %.0fs: killing it", child.name, self.grace_s)
            # The group may hold more than the leader (ranks, workers): kill what is left.
            child.signal_group(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(5.0)
        return [child.process.returncode for child in children]

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()
