"""Prometheus metrics of the operator itself (``aflowrl_operator_*``), served on /metrics.

The chart's optional ServiceMonitor scrapes them. Names follow the project's
``aflowrl_<component>_<what>_<unit>`` convention (checked by the tests against
``aflowrl.common.metrics.check_metric_name``; the operator may not import that package). The
registry also carries the process's ``process_*``, ``python_info`` and ``python_gc_*``.
"""

from __future__ import annotations

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Histogram,
)

_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

HANDLERS = ("reconcile", "child", "resync")
"""Values of the ``handler`` label: kopf's create / update / resume handler, a child's event,
and the periodic resync task."""
HANDLER_RESULTS = ("ok", "rejected", "retry", "error", "coalesced", "standby")
"""Values of the ``result`` label: the pass ran (``ok``), rejected the spec, hit an API error
that is retried later, failed otherwise, joined a pass already waiting, or was skipped because
this replica does not hold the leader Lease."""


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)  # read from /proc and the interpreter when scraped
    return registry


class OperatorMetrics:
    """Reconcile passes, their duration, the handlers that ran them, and the writes to children."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else _registry()
        self.label_names: dict[str, tuple[str, ...]] = {
            "aflowrl_operator_reconciles_total": ("result",),
            "aflowrl_operator_reconcile_duration_seconds": (),
            "aflowrl_operator_child_writes_total": ("kind", "action"),
            "aflowrl_operator_handler_calls_total": ("handler", "result"),
            "aflowrl_operator_handler_duration_seconds": ("handler",),
        }
        """Label names of each metric, by name (what the dashboard may group by)."""
        self.reconciles = Counter(
            "aflowrl_operator_reconciles",
            "Reconcile passes of a TrainingRun, by result (ok, rejected, error).",
            ["result"],
            registry=self.registry,
        )
        self.reconcile_duration = Histogram(
            "aflowrl_operator_reconcile_duration_seconds",
            "Wall time of one reconcile pass.",
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.child_writes = Counter(
            "aflowrl_operator_child_writes",
            "Writes to a run's children, by kind and action (created, patched, deleted).",
            ["kind", "action"],
            registry=self.registry,
        )
        self.handler_calls = Counter(
            "aflowrl_operator_handler_calls",
            "Calls of each handler (reconcile, child, resync), by result (ok, rejected, retry, "
            "error, coalesced, standby).",
            ["handler", "result"],
            registry=self.registry,
        )
        self.handler_duration = Histogram(
            "aflowrl_operator_handler_duration_seconds",
            "Wall time of one handler call (waiting for the run's lock included), by handler.",
            ["handler"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        # Every series exists from the start (at zero), so a rate sees the first pass too.
        for handler in HANDLERS:
            self.handler_duration.labels(handler)
            for result in HANDLER_RESULTS:
                self.handler_calls.labels(handler, result)
