"""Fixtures running the real operator (kopf, cluster-wide) against the emulated API server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kube_emulator import (
    COSCHEDULING,
    KUEUE,
    KUEUE_V1BETA1,
    MONITORING,
    PEERING,
    RESOURCES,
)
from operator_harness import Cluster, emulated_cluster


@pytest.fixture()
def chart_values() -> dict[str, Any]:
    """The chart values whose RBAC the emulated API server enforces on the operator (the
    defaults); a test module overrides this fixture to test other values."""
    return {}


@pytest.fixture()
async def cluster(chart_values: dict[str, Any]) -> AsyncIterator[Cluster]:
    """An emulated cluster (with the prometheus-operator API and Kueue ``v1beta2``) enforcing
    the chart's RBAC, and a running operator."""
    async with emulated_cluster(
        RESOURCES, MONITORING, KUEUE, COSCHEDULING, PEERING, chart_values=chart_values
    ) as harness:
        yield harness


@pytest.fixture()
async def cluster_kueue_v1beta1(chart_values: dict[str, Any]) -> AsyncIterator[Cluster]:
    """The same, with a Kueue that serves only ``v1beta1`` (before Kueue 0.15)."""
    async with emulated_cluster(
        RESOURCES, MONITORING, KUEUE_V1BETA1, COSCHEDULING, PEERING, chart_values=chart_values
    ) as harness:
        yield harness
