"""Prometheus metrics: names checked against the house convention, one registry per process.

Every metric is named ``aflowrl_<component>_<what>_<unit>`` (units ``seconds``, ``bytes``,
``total`` for counters, ``ratio``...). Components create theirs through :class:`ComponentMetrics`,
which enforces the pattern, so the Grafana dashboard can be checked against what is exported
(:func:`exported_metric_names`). Code records values into small stats objects and publishes them
here, rather than scattering client calls (the vLLM pattern).

Two families keep the names the ecosystem's dashboards and alerts already use, outside that
pattern: ``process_*`` / ``python_*`` (prometheus_client's process, platform and GC collectors,
in every registry :func:`new_registry` makes) and the standard gRPC server metrics of
go-grpc-prometheus (:class:`GrpcServerMetrics`, recorded by
:class:`aflowrl.common.interceptors.GrpcMetricsInterceptor`).

:class:`MetricsHttpServer` serves ``/metrics`` (and ``/healthz``) over aiohttp.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType

from aiohttp import web
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

logger = logging.getLogger(__name__)

COMPONENTS = ("environment", "rollout", "learner", "trainer", "executor", "operator")
"""Components that export metrics."""

UNITS = (
    # base units, and "total" for counters
    "seconds",
    "bytes",
    "total",
    "ratio",
    "tokens",
    "usd",
    "per_second",
    # dimensionless gauges, named by what they count or measure
    "info",
    "version",
    "score",
    "reward",
    "requests",
    "sequences",
    "replicas",
    "iteration",
    "loss",
    "norm",
    "entropy",
    "kl",
    "advantage",
)
"""Allowed name suffixes: base units, ``total`` for counters, and dimensionless gauge nouns."""

_NAME = re.compile(r"^aflowrl_([a-z]+)_[a-z0-9_]+_(" + "|".join(UNITS) + r")$")

LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
"""Seconds; from a cached lookup to a long evaluation."""


def check_metric_name(name: str) -> str:
    """Raise ValueError unless ``name`` follows ``aflowrl_<component>_<what>_<unit>``."""
    match = _NAME.match(name)
    if match is None or match.group(1) not in COMPONENTS:
        raise ValueError(
            f"metric name {name!r} does not follow aflowrl_<component>_<what>_<unit> "
            f"(component one of {', '.join(COMPONENTS)}; unit one of {', '.join(UNITS)})"
        )
    return name


def new_registry() -> CollectorRegistry:
    """A registry with this process's ``process_*``, ``python_info`` and ``python_gc_*``.

    The collectors read /proc and the interpreter when scraped, so a registry per server (or
    per test) costs nothing until someone looks.
    """
    registry = CollectorRegistry()
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    return registry


class ComponentMetrics:
    """Factory of one component's metrics in a registry (a fresh registry per server/test)."""

    def __init__(self, component: str, registry: CollectorRegistry | None = None) -> None:
        if component not in COMPONENTS:
            raise ValueError(f"unknown metrics component {component!r}")
        self.component = component
        self.registry = registry if registry is not None else new_registry()
        self.label_names: dict[str, tuple[str, ...]] = {}
        """Label names of every metric made here, by name (what dashboards may group by)."""

    def _name(self, what: str, labels: Sequence[str]) -> str:
        name = check_metric_name(f"aflowrl_{self.component}_{what}")
        self.label_names[name] = tuple(labels)
        return name

    def counter(self, what: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        """A counter; ``what`` ends in ``_total`` (prometheus_client strips and re-adds it)."""
        name = self._name(what, labels)
        return Counter(name.removesuffix("_total"), doc, list(labels), registry=self.registry)

    def gauge(self, what: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(self._name(what, labels), doc, list(labels), registry=self.registry)

    def histogram(
        self,
        what: str,
        doc: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> Histogram:
        return Histogram(
            self._name(what, labels), doc, list(labels), buckets=buckets, registry=self.registry
        )


GRPC_TYPES = {
    # (request streams, response streams) -> grpc_type, as go-grpc-prometheus names them
    (False, False): "unary",
    (True, False): "client_stream",
    (False, True): "server_stream",
    (True, True): "bidi_stream",
}

GRPC_HANDLING_BUCKETS = (*LATENCY_BUCKETS, 1800.0, 3600.0)
"""Seconds; up to the hour a large Train step or weight push may take."""


class GrpcServerMetrics:
    """The standard gRPC server metrics (go-grpc-prometheus / py-grpc-prometheus names).

    ``grpc_server_started_total``, ``grpc_server_handled_total`` (with ``grpc_code``),
    ``grpc_server_msg_received_total``, ``grpc_server_msg_sent_total`` and the
    ``grpc_server_handling_seconds`` histogram, labelled ``grpc_type``, ``grpc_service`` and
    ``grpc_method``. In flight = started - handled. :meth:`preregister` gives every method of a
    service its zero series up front, as go-grpc-prometheus does, so rates and error ratios
    exist from the first scrape instead of appearing with the first error.
    """

    LABELS = ("grpc_type", "grpc_service", "grpc_method")

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        labels = list(self.LABELS)
        self.label_names: dict[str, tuple[str, ...]] = {
            "grpc_server_started_total": self.LABELS,
            "grpc_server_handled_total": (*self.LABELS, "grpc_code"),
            "grpc_server_msg_received_total": self.LABELS,
            "grpc_server_msg_sent_total": self.LABELS,
            "grpc_server_handling_seconds": self.LABELS,
        }
        """Label names of each metric, by name (as :attr:`ComponentMetrics.label_names`)."""
        self.started = Counter(
            "grpc_server_started",
            "Total number of RPCs started on the server.",
            labels,
            registry=registry,
        )
        self.handled = Counter(
            "grpc_server_handled",
            "Total number of RPCs completed on the server, regardless of success or failure.",
            [*labels, "grpc_code"],
            registry=registry,
        )
        self.msg_received = Counter(
            "grpc_server_msg_received",
            "Total number of RPC stream messages received on the server.",
            labels,
            registry=registry,
        )
        self.msg_sent = Counter(
            "grpc_server_msg_sent",
            "Total number of gRPC stream messages sent by the server.",
            labels,
            registry=registry,
        )
        self.handling = Histogram(
            "grpc_server_handling_seconds",
            "Histogram of response latency (seconds) of gRPC that had been application-level "
            "handled by the server.",
            labels,
            buckets=GRPC_HANDLING_BUCKETS,
            registry=registry,
        )

    def preregister(self, methods: Sequence[tuple[str, str, str]], codes: Sequence[str]) -> None:
        """Zero series for every ``(grpc_type, grpc_service, grpc_method)`` and status code."""
        for method in methods:
            for metric in (self.started, self.msg_received, self.msg_sent, self.handling):
                metric.labels(*method)
            for code in codes:
                self.handled.labels(*method, code)


def exported_metric_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name a registry exports (``_total``, ``_bucket``, ``_sum``... included)."""
    names: set[str] = set()
    for family in registry.collect():
        names.add(family.name)
        for sample in family.samples:
            names.add(sample.name)
    return names


Handler = Callable[[web.Request], Awaitable[web.Response]]


def metrics_handler(registry: CollectorRegistry) -> Handler:
    """An aiohttp handler answering ``GET /metrics`` with ``registry`` in the text format."""

    async def handle(_request: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    return handle


async def start_http(
    app: web.Application,
    host: str,
    port: int,
    *,
    backlog: int = 128,
    auto_decompress: bool = True,
) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on ``host:port`` (0: an ephemeral port); returns the runner and the port.
    ``auto_decompress=False``: request bodies reach the handlers as sent (``Content-Encoding``
    not undone), for a server that decodes them within its own bounds."""
    runner = web.AppRunner(app, access_log=None, auto_decompress=auto_decompress)
    await runner.setup()
    await web.TCPSite(runner, host, port, backlog=backlog).start()
    return runner, int(runner.addresses[0][1]) if port == 0 else port


class MetricsHttpServer:
    """``async with MetricsHttpServer(registry, port)``: serves /metrics and /healthz."""

    def __init__(self, registry: CollectorRegistry, port: int, host: str = "0.0.0.0") -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def __aenter__(self) -> MetricsHttpServer:
        app = web.Application()
        app.router.add_get("/metrics", metrics_handler(self.registry))
        app.router.add_get("/healthz", self._healthz)
        self._runner, self.port = await start_http(app, self.host, self.port)
        logger.info("metrics on http://%s:%d/metrics", self.host, self.port)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
