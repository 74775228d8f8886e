"""Fixtures running the real operator (kopf, cluster-wide) against the emulated API server."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import kmock
import pytest
from kube_emulator import (
    COSCHEDULING,
    KUEUE,
    KUEUE_V1BETA1,
    MONITORING,
    PEERING,
    RESOURCES,
    KubeEmulator,
)
from operator_harness import Cluster


@contextlib.asynccontextmanager
async def _cluster(kueue: dict[str, tuple[str, bool, bool]]) -> AsyncIterator[Cluster]:
    async with KubeEmulator() as emulator, kmock.Server(emulator) as server:
        emulator.declare(RESOURCES)
        emulator.declare(MONITORING)
        emulator.declare(kueue)
        emulator.declare(COSCHEDULING)
        emulator.declare(PEERING)
        harness = Cluster(emulator, server)
        await harness.start_operator()
        try:
            yield harness
        finally:
            await harness.stop_operator()


@pytest.fixture()
async def cluster() -> AsyncIterator[Cluster]:
    """An emulated cluster (with the prometheus-operator API and Kueue ``v1beta2``) and a
    running operator."""
    async with _cluster(KUEUE) as harness:
        yield harness


@pytest.fixture()
async def cluster_kueue_v1beta1() -> AsyncIterator[Cluster]:
    """The same, with a Kueue that serves only ``v1beta1`` (before Kueue 0.15)."""
    async with _cluster(KUEUE_V1BETA1) as harness:
        yield harness
