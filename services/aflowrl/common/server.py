"""The asyncio gRPC server every aflow-rl service runs in.

``GrpcServer`` is an async context manager that owns the gRPC server, the standard health service,
reflection, the interceptor chain and the ``/metrics`` HTTP endpoint::

    async with GrpcServer(options, [registration], warmup=engine.warm_up) as server:
        await server.serve_until_signal()

Health (``grpc.health.v1``) reports NOT_SERVING until ``warmup`` has finished, SERVING after, and
NOT_SERVING again as soon as SIGTERM arrives; then in-flight calls get ``grace_s`` seconds to finish
(``server.stop(grace)``) while new calls are refused. Kubernetes probes use ``grpc:`` on the same
port; keep ``grace_s`` below the pod's ``terminationGracePeriodSeconds``.

With TLS (:mod:`aflowrl.common.tls`) the kubelet's ``grpc:`` probe, which speaks only plaintext
and presents no certificate, cannot reach that port. The server then also listens on
``health_port``: a second, plaintext server with the same health servicer and nothing else (no
reflection, no service, no metrics), so a probe sees exactly the status a TLS client would, and
the port discloses nothing but SERVING / NOT_SERVING. An exec probe was the alternative; it
would start a Python interpreter per probe and need the client certificate in the probe.

Every server uses the keepalive policy of :data:`aflowrl.common.keepalive.KEEPALIVE` (the one
the clients' pings are paced by), and records the standard gRPC server metrics
(:class:`aflowrl.common.metrics.GrpcServerMetrics`) in its component's registry, which also
exports the process's ``process_*`` series.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from aflowrl import __version__, envs
from aflowrl.common.interceptors import server_interceptors
from aflowrl.common.keepalive import KEEPALIVE, Keepalive
from aflowrl.common.metrics import (
    GRPC_TYPES,
    ComponentMetrics,
    GrpcServerMetrics,
    MetricsHttpServer,
)
from aflowrl.common.tls import ServerTls, server_tls_from_spec
from aflowrl.config.monitoring import GrpcSpec

logger = logging.getLogger(__name__)

MIB = 1024 * 1024


@dataclass(frozen=True)
class ServerOptions:
    """Where and how a service listens. Build with :meth:`from_spec` in entry points."""

    component: str
    """Metrics component name: "environment", "rollout" or "learner"."""
    host: str = "0.0.0.0"
    """Interface to bind ("127.0.0.1" for local runs)."""
    port: int = 0
    """gRPC port; 0 picks a free one (see ``GrpcServer.port``)."""
    metrics_port: int | None = None
    """HTTP port of /metrics; 0 picks a free one; None serves no metrics."""
    grace_s: float = 20.0
    """Seconds in-flight calls get on shutdown."""
    drain_s: float = 0.0
    """Seconds between NOT_SERVING and refusing calls (lets load balancers notice)."""
    max_message_bytes: int = 64 * MIB
    """Largest message sent or received."""
    max_concurrent_rpcs: int | None = 1024
    """Calls handled at once; more get RESOURCE_EXHAUSTED."""
    tls: ServerTls | None = None
    """Certificate, key and (mutual TLS) the clients' CA; None: plaintext."""
    health_port: int | None = None
    """With TLS: plaintext port serving only health (0 picks a free one); None: none."""
    auth_token: str | None = field(default=None, repr=False)
    """Bearer token every call must carry (health and reflection excepted); None: no auth."""
    keepalive: Keepalive = KEEPALIVE
    """Ping policy admitted from clients (tests pair other values)."""

    @classmethod
    def from_spec(
        cls,
        component: str,
        grpc_spec: GrpcSpec,
        *,
        port: int,
        metrics_port: int | None,
        host: str = "0.0.0.0",
        health_port: int | None = None,
    ) -> ServerOptions:
        """Options from the run spec, with secrets taken from the environment (mounted Secrets).

        ``health_port`` overrides ``grpc.healthPort`` (0: a free port); it is used only when
        TLS is on.
        """
        tls = server_tls_from_spec(grpc_spec)
        if health_port is None:
            health_port = grpc_spec.health_port
        return cls(
            component=component,
            host=host,
            port=port,
            metrics_port=metrics_port,
            grace_s=grpc_spec.shutdown_grace_s,
            max_message_bytes=grpc_spec.max_message_mib * MIB,
            max_concurrent_rpcs=grpc_spec.max_concurrent_rpcs,
            tls=tls,
            health_port=health_port if tls is not None else None,
            auth_token=envs.AFLOWRL_AUTH_TOKEN,
        )


@dataclass(frozen=True)
class ServiceRegistration:
    """A servicer and the generated function that adds it to a server."""

    servicer: Any
    add_to_server: Callable[[Any, aio.Server], None]
    name: str
    """Full service name, e.g. "aflowrl.v1.EnvironmentService" (health and reflection key)."""


def _methods(service_names: Sequence[str]) -> list[tuple[str, str, str]]:
    """``(grpc_type, service, method)`` of every method of the named (imported) services."""
    pool = descriptor_pool.Default()
    methods = []
    for name in service_names:
        try:
            service = pool.FindServiceByName(name)
        except KeyError:
            continue  # e.g. a test's generic handler: its series appear with its first call
        for method in service.methods:
            kind = GRPC_TYPES[(method.client_streaming, method.server_streaming)]
            methods.append((kind, name, method.name))
    return methods


def _security(options: ServerOptions, health_port: int | None) -> str:
    if options.tls is None:
        return "plaintext"
    mode = "mutual TLS" if options.tls.mtls else "TLS"
    return f"{mode}, plaintext health on port {health_port}" if health_port else mode


class GrpcServer:
    """A gRPC server with health, reflection, interceptors and metrics (see module docstring)."""

    def __init__(
        self,
        options: ServerOptions,
        services: Sequence[ServiceRegistration],
        *,
        warmup: Callable[[], Awaitable[None]] | None = None,
        metrics: ComponentMetrics | None = None,
    ) -> None:
        self.options = options
        self.services = list(services)
        self.metrics = metrics or ComponentMetrics(options.component)
        self.grpc_metrics = GrpcServerMetrics(self.metrics.registry)
        self._warmup = warmup
        self._server: aio.Server | None = None
        self._health_server: aio.Server | None = None
        self._metrics_server: MetricsHttpServer | None = None
        self._health = HealthServicer()
        self._stopping = asyncio.Event()
        self._stopped = False
        self._signals: list[signal.Signals] = []
        """Signals handled by this server (:meth:`handle_signals`)."""
        self._started_at = time.monotonic()
        self.port = options.port
        self.metrics_port = options.metrics_port
        self.health_port = options.health_port

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self._started_at

    @property
    def health(self) -> HealthServicer:
        return self._health

    @property
    def stopping(self) -> bool:
        """SIGTERM (or a stop request) arrived: health stays NOT_SERVING from now on."""
        return self._stopping.is_set()

    async def _set_all(self, status: int) -> None:
        for name in ["", *(s.name for s in self.services)]:
            await self._health.set(name, status)

    async def start(self) -> None:
        opts = self.options
        server_options = [
            ("grpc.max_send_message_length", opts.max_message_bytes),
            ("grpc.max_receive_message_length", opts.max_message_bytes),
            ("grpc.so_reuseport", 0),
            *opts.keepalive.server_args(),
        ]
        self._server = aio.server(
            interceptors=server_interceptors(self.grpc_metrics, opts.auth_token),
            options=server_options,
            maximum_concurrent_rpcs=opts.max_concurrent_rpcs,
        )
        for service in self.services:
            service.add_to_server(service.servicer, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        await self._set_all(health_pb2.HealthCheckResponse.NOT_SERVING)
        names = [s.name for s in self.services]
        health_name = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
        reflection.enable_server_reflection(
            [*names, health_name, reflection.SERVICE_NAME], self._server
        )
        self.grpc_metrics.preregister(
            _methods([*names, health_name]), [code.name for code in grpc.StatusCode]
        )
        address = f"{opts.host}:{opts.port}"
        if opts.tls is not None:
            self.port = self._server.add_secure_port(address, opts.tls.credentials())
        else:
            self.port = self._server.add_insecure_port(address)
        if self.port == 0:
            raise OSError(f"could not bind gRPC port {address}")
        await self._server.start()
        if opts.tls is not None and opts.health_port is not None:
            await self._start_health_server(server_options)
        self._started_at = time.monotonic()
        if opts.metrics_port is not None:
            self._metrics_server = MetricsHttpServer(
                self.metrics.registry, opts.metrics_port, opts.host
            )
            await self._metrics_server.__aenter__()
            self.metrics_port = self._metrics_server.port
        logger.info(
            "%s %s serving %s on %s:%d (%s; health NOT_SERVING until warm)",
            opts.component,
            __version__,
            ", ".join(names),
            opts.host,
            self.port,
            _security(opts, self.health_port),
        )
        if self._warmup is not None:
            await self._warmup()
        if not self._stopping.is_set():
            await self._set_all(health_pb2.HealthCheckResponse.SERVING)
            logger.info("%s is SERVING", opts.component)

    async def _start_health_server(self, server_options: list[tuple[str, Any]]) -> None:
        """The plaintext health-only server for kubelet probes (module docstring)."""
        self._health_server = aio.server(options=server_options, maximum_concurrent_rpcs=16)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._health_server)
        address = f"{self.options.host}:{self.options.health_port}"
        self.health_port = self._health_server.add_insecure_port(address)
        if self.health_port == 0:
            raise OSError(f"could not bind the health port {address}")
        await self._health_server.start()

    async def stop(self) -> None:
        """Graceful stop: NOT_SERVING, optional drain, then ``stop(grace)``. Idempotent."""
        self._stopping.set()
        if self._stopped:
            return
        self._stopped = True
        await self._health.enter_graceful_shutdown()
        if self._server is not None:
            if self.options.drain_s > 0:
                await asyncio.sleep(self.options.drain_s)
            logger.info("%s stopping (grace %.1fs)", self.options.component, self.options.grace_s)
            await self._server.stop(self.options.grace_s)
        if self._health_server is not None:
            await self._health_server.stop(0)
        if self._metrics_server is not None:
            await self._metrics_server.__aexit__(None, None, None)
        logger.info("%s stopped", self.options.component)

    def request_stop(self) -> None:
        """Ask :meth:`serve_until_signal` to return (safe from signal handlers)."""
        self._stopping.set()

    def handle_signals(
        self, signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
    ) -> None:
        """From now on ``signals`` stop the server gracefully (call it before entering the
        server: a SIGTERM that arrives as soon as the server answers health checks then stops
        it through its clean-up, not through the default action, which would leave its
        children behind)."""
        loop = asyncio.get_running_loop()
        for sig in signals:
            if sig in self._signals:
                continue
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._on_signal, sig)
                self._signals.append(sig)

    async def serve_until_signal(
        self, signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
    ) -> None:
        """Serve until a signal arrives (or :meth:`request_stop`), then stop gracefully.

        The handlers stay until the event loop closes: more signals may follow the first (a
        launcher killed outright sends its parent-death SIGTERM once for every thread it
        loses), and each must find the handler, not the default action that would cut the
        clean-up short and leave the service's children behind.
        """
        self.handle_signals(signals)
        try:
            await self._stopping.wait()
        finally:
            await self.stop()

    def _on_signal(self, sig: signal.Signals) -> None:
        logger.info("%s received %s", self.options.component, sig.name)
        self._stopping.set()

    async def __aenter__(self) -> GrpcServer:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
