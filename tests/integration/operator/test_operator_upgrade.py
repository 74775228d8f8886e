"""An operator upgrade that changes a default, with the real operator (kopf) against the
emulated API server, which stores each TrainingRun with its CRD's structural defaults as the
API server does: a running run's pods are left alone, a run created afterwards gets the new
default."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from operator_harness import DEPLOYMENTS, JOBS, STATEFULSETS, TINY, Cluster

from aflowrl.config.monitoring import GrpcSpec
from crd_admission import changed_default

pytestmark = pytest.mark.timeout(180)

CONFIGMAPS = "v1/configmaps"


def _pods(cluster: Cluster, name: str) -> dict[str, Any] | None:
    """The pod templates of a run's workloads and the spec its pods read, once all exist."""
    found = {
        "rollout": cluster.child(DEPLOYMENTS, f"{name}-rollout"),
        "env": cluster.child(DEPLOYMENTS, f"{name}-env"),
        "learner": cluster.child(STATEFULSETS, f"{name}-learner"),
        "trainer": cluster.child(JOBS, f"{name}-trainer"),
        "spec": cluster.child(CONFIGMAPS, f"{name}-spec"),
    }
    if any(obj is None for obj in found.values()):
        return None
    out: dict[str, Any] = {
        key: obj["spec"]["template"] for key, obj in found.items() if key != "spec"
    }
    out["spec.yaml"] = yaml.safe_load(found["spec"]["data"]["spec.yaml"])
    return out


async def test_an_operator_upgrade_that_changes_a_default_leaves_a_running_runs_pods_untouched(
    cluster: Cluster,
):
    await cluster.create_run("old", TINY)
    assert cluster.run("old")["spec"]["grpc"]["maxMessageMib"] == 64  # stored by the server
    await cluster.eventually(lambda: _pods(cluster, "old"), what="the run's workloads")
    await cluster.settle()
    before = _pods(cluster, "old")
    changes = len(cluster.emulator.changed)
    await cluster.stop_operator()

    # The new release: the model and its CRD default grpc.maxMessageMib to 65.
    with changed_default(GrpcSpec, "max_message_mib", 65):
        await cluster.start_operator()
        await cluster.create_run("new", TINY)
        await cluster.eventually(lambda: _pods(cluster, "new"), what="the new run")
        await cluster.settle()
        fresh = _pods(cluster, "new")

        assert _pods(cluster, "old") == before
        assert before is not None and before["spec.yaml"]["grpc"]["maxMessageMib"] == 64
        assert cluster.run("old")["spec"]["grpc"]["maxMessageMib"] == 64
        # The upgraded operator changed none of the old run's children ...
        assert [c for c in cluster.emulator.changed[changes:] if c[2].startswith("old-")] == []
        # ... and the run created under it has the new default.
        assert fresh is not None and fresh["spec.yaml"]["grpc"]["maxMessageMib"] == 65
        assert cluster.run("new")["spec"]["grpc"]["maxMessageMib"] == 65
