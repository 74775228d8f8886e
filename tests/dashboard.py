"""Reading the Grafana dashboard's queries, for the tests that check them.

Used by tests/unit/operator/test_grafana_dashboard.py (names and labels against the metric
catalogues) and tests/integration/test_dashboard_prometheus.py (the queries run by a real
Prometheus scraping a local run).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parent.parent / "manifests" / "grafana" / "aflow-rl.json"

TARGET_LABELS = frozenset(
    {
        # prometheus-operator's PodMonitor targets
        "namespace",
        "pod",
        "container",
        "endpoint",
        "job",
        "instance",
        # the run's PodMonitor podTargetLabels: aflowrl.io/run, app.kubernetes.io/component
        "aflowrl_io_run",
        "app_kubernetes_io_component",
    }
)
"""Labels Prometheus adds to every series of a run's pods (the operator's ``pod_monitor``)."""

OPERATOR_PANELS = frozenset({"Operator passes/s", "Operator pass time", "Operator process"})
"""Panels of the operator itself (its ServiceMonitor's series): not filtered by run."""

_LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
_LABEL_VALUES = re.compile(r"label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$")


def legend_labels(legend: str) -> list[str]:
    """Labels a legend format shows (``{{label}}``)."""
    return _LEGEND.findall(legend)


@dataclass(frozen=True)
class Query:
    """One PromQL query of a panel (or of a template variable)."""

    where: str
    """The panel's title, or ``$variable``."""
    expr: str
    legend: str = ""

    @property
    def legend_labels(self) -> list[str]:
        """Labels the legend shows: every series must carry them."""
        return legend_labels(self.legend)


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def panel_queries(dashboard: dict) -> list[Query]:
    """Every panel's queries."""
    return [
        Query(panel["title"], target["expr"], target.get("legendFormat", ""))
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


def variable_queries(dashboard: dict) -> list[Query]:
    """``label_values(SELECTOR, LABEL)`` of each query variable as ``SELECTOR`` with legend
    ``{{LABEL}}``: the series whose LABEL values the variable offers."""
    found = []
    for variable in dashboard["templating"]["list"]:
        if "definition" in variable:
            match = _LABEL_VALUES.match(variable["definition"])
            if match is None:
                raise ValueError(f"${variable['name']}: not label_values(...)")
            found.append(Query(f"${variable['name']}", match.group(1), f"{{{{{match.group(2)}}}}}"))
    return found
