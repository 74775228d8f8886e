"""The Grafana dashboard uses only metrics the services export, with labels those metrics carry.

Every panel query is read for the metric names it selects, the label names it matches, groups by
(``by``, ``without``, ``on``, ``ignoring``) and shows in its legend (``{{label}}``); each must be a
label of a metric in the query, ``le`` of a histogram's buckets, or a target label the run's
PodMonitor puts on every series (tests/dashboard.py reads the queries).
tests/integration/test_dashboard_prometheus.py runs the same queries against a real Prometheus
scraping a local run.
"""

from __future__ import annotations

import re

from aflowrl.common.metrics import GrpcServerMetrics, exported_metric_names, new_registry
from aflowrl.envsvc.metrics import EnvironmentMetrics
from aflowrl.learner.metrics import LearnerMetrics
from aflowrl.rollout.metrics import RolloutMetrics
from aflowrl.trainer.metrics import TrainerMetrics
from aflowrl_operator.metrics import OperatorMetrics
from dashboard import (
    OPERATOR_PANELS,
    TARGET_LABELS,
    legend_labels,
    load,
    panel_queries,
    variable_queries,
)

_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
_SAMPLE_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


def catalogue() -> dict[str, frozenset[str]]:
    """Every metric the services and the operator export, with its label names (``_total``
    names included)."""
    families: dict[str, frozenset[str]] = {}
    for metrics in (EnvironmentMetrics(), RolloutMetrics(), LearnerMetrics(), TrainerMetrics()):
        families.update({name: frozenset(labels) for name, labels in metrics.label_names.items()})
    families.update(
        {name: frozenset(labels) for name, labels in OperatorMetrics().label_names.items()}
    )
    grpc_metrics = GrpcServerMetrics(new_registry())
    families.update({n: frozenset(labels) for n, labels in grpc_metrics.label_names.items()})
    for name in exported_metric_names(new_registry()):  # process_*, python_*
        families.setdefault(name, frozenset())
    return families


def _family(name: str, families: dict[str, frozenset[str]]) -> tuple[str, bool] | None:
    """The catalogue name a sample name belongs to, and whether it is a histogram's bucket."""
    if name in families:
        return name, False
    for suffix in _SAMPLE_SUFFIXES:
        base = name.removesuffix(suffix)
        if name.endswith(suffix) and (base in families or f"{base}_total" in families):
            return (base if base in families else f"{base}_total"), suffix == "_bucket"
    return None


def problems(expr: str, legend: str, families: dict[str, frozenset[str]]) -> list[str]:
    """What in one query names a metric or a label that no exported series has."""
    found: list[str] = []
    available: set[str] = set(TARGET_LABELS)
    for name, matchers in _SELECTOR.findall(expr):
        family = _family(name, families)
        if family is None:
            found.append(f"metric {name} is not exported")
            continue
        labels = families[family[0]] | TARGET_LABELS | ({"le"} if family[1] else set())
        available |= labels
        found += [
            f"{name} has no label {label!r}"
            for label in _MATCHER.findall(matchers)
            if label not in labels
        ]
    grouped: list[set[str]] = []
    for group in _GROUPING.findall(expr):
        names = {label.strip() for label in group.split(",") if label.strip()}
        grouped.append(names)
        found += [
            f"grouping by {label!r}, a label of none of its metrics"
            for label in sorted(names - available)
        ]
    # A legend label must survive the aggregation: it is in every `by` of the query.
    outer = set.intersection(*grouped) if grouped else available
    found += [
        f"legend {{{{{label}}}}} is not a label of the result"
        for label in legend_labels(legend)
        if label not in outer
    ]
    return found


def test_every_query_uses_exported_metrics_and_their_labels():
    dashboard = load()
    families = catalogue()
    used = set()
    failures = []
    for query in panel_queries(dashboard) + variable_queries(dashboard):
        used |= {name for name, _ in _SELECTOR.findall(query.expr)}
        failures += [
            f"{query.where}: {problem}" for problem in problems(query.expr, query.legend, families)
        ]
    assert failures == []
    assert len(used) >= 40
    for standard in ("grpc_server_handled_total", "grpc_server_handling_seconds_bucket"):
        assert standard in used
    assert any(name.startswith("process_") for name in used)


_RATED = re.compile(r"\b(?:rate|irate|increase|delta)\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)")


def _samples_at_start() -> set[str]:
    """The sample names each component exports before it has observed anything, built as its
    server builds it (one served benchmark, the grpc weight transport, gRPC methods
    preregistered)."""
    registries = [
        EnvironmentMetrics(benchmarks=("humaneval",)).registry,
        RolloutMetrics(transports=("grpc",)).registry,
        LearnerMetrics(transports=("grpc",)).registry,
        TrainerMetrics().registry,
        OperatorMetrics().registry,
    ]
    grpc_metrics = GrpcServerMetrics(new_registry())
    grpc_metrics.preregister([("unary", "aflowrl.v1.EnvironmentService", "Step")], ["OK"])
    registries += [grpc_metrics.registry, new_registry()]  # the last: process_*, python_*
    return set().union(*(exported_metric_names(r) for r in registries))


def test_every_series_the_dashboard_rates_exists_before_anything_is_observed():
    """A rate needs two samples of a series. A labelled series that appears only at its first
    observation has, when the scrapes around that moment fail or come late (a busy node), a
    first sample already holding the count, and its rate is empty or its quantile NaN. So
    every series a panel takes a rate of is exported at zero from the start."""
    at_start = _samples_at_start()
    rated = {name for query in panel_queries(load()) for name in _RATED.findall(query.expr)}
    assert len(rated) >= 25
    assert sorted(rated - at_start) == []


def test_the_check_catches_a_missing_metric_or_label():
    families = catalogue()
    sel = 'namespace="ns", aflowrl_io_run="run"'
    assert problems(f"sum(rate(aflowrl_trainer_episodes_total{{{sel}}}[5m]))", "", families) == []
    assert problems(f"aflowrl_trainer_made_up_seconds_bucket{{{sel}}}", "", families) == [
        "metric aflowrl_trainer_made_up_seconds_bucket is not exported"
    ]
    wrong_group = f"sum by (phase) (rate(aflowrl_trainer_episodes_total{{{sel}}}[5m]))"
    assert problems(wrong_group, "{{phase}}", families) == [
        "grouping by 'phase', a label of none of its metrics"
    ]
    wrong_matcher = f'grpc_server_started_total{{{sel}, grpc_code="OK"}}'
    assert problems(wrong_matcher, "", families) == [
        "grpc_server_started_total has no label 'grpc_code'"
    ]
    lost = f"sum by (grpc_service) (rate(grpc_server_handled_total{{{sel}}}[5m]))"
    assert problems(lost, "{{grpc_method}}", families) == [
        "legend {{grpc_method}} is not a label of the result"
    ]
    buckets = f"rate(grpc_server_handling_seconds_bucket{{{sel}}}[5m])"
    assert problems(f"histogram_quantile(0.9, sum by (le) ({buckets}))", "", families) == []
    assert problems(f"sum by (le) (grpc_server_started_total{{{sel}}})", "", families) == [
        "grouping by 'le', a label of none of its metrics"
    ]


def test_the_dashboard_has_the_panels_a_run_needs():
    dashboard = load()
    titles = {p["title"] for p in dashboard["panels"]}
    for title in (
        "Reward and best score",
        "Valid-action ratio",
        "Rollout tokens/s",
        "Rollout queue",
        "Learner loss",
        "KL and entropy",
        "Learner step time",
        "Environment evaluations/s",
        "Evaluation cache hit ratio",
        "Executor cost and tokens",
        "Weight-sync time",
        "Iteration time by phase",
        "gRPC calls/s",
        "gRPC p95 latency",
        "gRPC errors",
        "CPU",
        "Resident memory",
        *OPERATOR_PANELS,
    ):
        assert title in titles
    variables = [v["name"] for v in dashboard["templating"]["list"]]
    assert variables == ["datasource", "namespace", "run"]
    for query in panel_queries(dashboard):
        if query.where in OPERATOR_PANELS:  # the operator serves every run: cluster-wide
            assert "aflowrl_operator_" in query.expr, query
            continue
        assert 'aflowrl_io_run="$run"' in query.expr, query  # every series is the selected run's
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
