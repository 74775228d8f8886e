"""Fixtures running the real operator (kopf, cluster-wide) against the emulated API server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import kmock
import pytest
from kube_emulator import COSCHEDULING, KUEUE, MONITORING, PEERING, RESOURCES, KubeEmulator
from operator_harness import Cluster


@pytest.fixture()
async def cluster() -> AsyncIterator[Cluster]:
    """An emulated cluster (with the prometheus-operator API) and a running operator."""
    async with KubeEmulator() as emulator, kmock.Server(emulator) as server:
        emulator.declare(RESOURCES)
        emulator.declare(MONITORING)
        emulator.declare(KUEUE)
        emulator.declare(COSCHEDULING)
        emulator.declare(PEERING)
        harness = Cluster(emulator, server)
        await harness.start_operator()
        try:
            yield harness
        finally:
            await harness.stop_operator()
