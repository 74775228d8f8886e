"""Fixtures running the real operator (kopf, cluster-wide) against the emulated API server."""

from __future__ import annotations

from collections.abc import AsyncIterator

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
async def cluster() -> AsyncIterator[Cluster]:
    """An emulated cluster (with the prometheus-operator API and Kueue ``v1beta2``) and a
    running operator."""
    async with emulated_cluster(RESOURCES, MONITORING, KUEUE, COSCHEDULING, PEERING) as harness:
        yield harness


@pytest.fixture()
async def cluster_kueue_v1beta1() -> AsyncIterator[Cluster]:
    """The same, with a Kueue that serves only ``v1beta1`` (before Kueue 0.15)."""
    async with emulated_cluster(
        RESOURCES, MONITORING, KUEUE_V1BETA1, COSCHEDULING, PEERING
    ) as harness:
        yield harness
