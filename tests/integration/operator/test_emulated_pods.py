"""The emulated API server's pods and controllers (no operator): pods that run without being
ready, pods terminating within their grace period, and the status their owners' controllers
write from them, as the operator's tests see them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest
from kube_emulator import GROUPS, RESOURCES, KubeEmulator

NS = "team-a"
DEPLOYMENTS = "apps/v1/deployments"
STATEFULSETS = "apps/v1/statefulsets"
JOBS = "batch/v1/jobs"
LWS = "leaderworkerset.x-k8s.io/v1/leaderworkersets"
PODS = "v1/pods"
TEMPLATE = {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c"}]}}


@pytest.fixture()
async def emulator() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as emulator, kmock.Server(emulator):
        emulator.declare(RESOURCES)
        emulator.declare(GROUPS)
        yield emulator


async def _workload(emulator: KubeEmulator, resource: str, kind: str, spec: dict) -> None:
    api = (
        "batch/v1"
        if kind == "Job"
        else "leaderworkerset.x-k8s.io/v1"
        if kind == "LeaderWorkerSet"
        else "apps/v1"
    )
    body: dict[str, Any] = {
        "apiVersion": api,
        "kind": kind,
        "metadata": {"name": "w", "namespace": NS},
        "spec": spec,
    }
    await emulator.put_object(resource, body)


def _status(emulator: KubeEmulator, resource: str) -> dict:
    obj = emulator.read(resource, NS, "w")
    assert obj is not None
    return obj.get("status") or {}


async def test_running_but_unready_pods_are_not_ready_replicas(emulator: KubeEmulator):
    await _workload(emulator, DEPLOYMENTS, "Deployment", {"replicas": 3, "template": TEMPLATE})
    await emulator.start_pods(DEPLOYMENTS, NS, "w", 2)
    (starting,) = await emulator.start_pods(DEPLOYMENTS, NS, "w", 1, ready=False)
    status = _status(emulator, DEPLOYMENTS)
    assert (status["replicas"], status["readyReplicas"], status["availableReplicas"]) == (3, 2, 2)
    pod = emulator.read(PODS, NS, starting)
    assert pod is not None and pod["status"]["phase"] == "Running"
    assert pod["metadata"]["labels"] == {"app": "x"}
    await emulator.set_pod_ready(NS, starting)
    assert _status(emulator, DEPLOYMENTS)["readyReplicas"] == 3


async def test_a_deleted_pod_on_a_node_terminates_within_its_grace_and_stays_counted(
    emulator: KubeEmulator,
):
    await _workload(emulator, JOBS, "Job", {"parallelism": 2, "template": TEMPLATE})
    first, second = await emulator.start_pods(JOBS, NS, "w", 2)
    assert (_status(emulator, JOBS)["active"], _status(emulator, JOBS)["ready"]) == (2, 2)

    await emulator.delete_object(PODS, NS, first)  # a DELETE, as the API server serves it
    pod = emulator.read(PODS, NS, first)
    assert pod is not None, "a pod bound to a node stays until its kubelet confirms"
    assert pod["metadata"]["deletionTimestamp"] and pod["metadata"]["deletionGracePeriodSeconds"]
    status = _status(emulator, JOBS)
    assert (status["active"], status["ready"], status["terminating"]) == (1, 1, 1)

    assert await emulator.finish_termination(NS) == [first]
    assert emulator.read(PODS, NS, first) is None
    assert _status(emulator, JOBS)["terminating"] == 0
    assert emulator.read(PODS, NS, second) is not None


async def test_a_terminating_pod_with_a_finalizer_stays_until_the_finalizer_goes(
    emulator: KubeEmulator,
):
    await _workload(emulator, STATEFULSETS, "StatefulSet", {"replicas": 1, "template": TEMPLATE})
    (name,) = await emulator.start_pods(STATEFULSETS, NS, "w")
    await emulator.patch_object(PODS, NS, name, {"metadata": {"finalizers": ["example.com/x"]}})
    await emulator.terminate_pod(NS, name)
    status = _status(emulator, STATEFULSETS)
    assert (status["replicas"], status["readyReplicas"]) == (1, 0)  # created, not ready
    assert await emulator.finish_termination(NS, name) == []
    assert emulator.read(PODS, NS, name) is not None
    await emulator.patch_object(PODS, NS, name, {"metadata": {"finalizers": None}})
    assert emulator.read(PODS, NS, name) is None


async def test_a_suspended_job_keeps_its_pods_terminating_until_they_stop(
    emulator: KubeEmulator,
):
    await _workload(emulator, JOBS, "Job", {"parallelism": 1, "template": TEMPLATE})
    await emulator.play_controller(JOBS, NS, "w")
    assert _status(emulator, JOBS)["active"] == 1
    await emulator.patch_object(JOBS, NS, "w", {"spec": {"suspend": True}})
    await emulator.play_controller(JOBS, NS, "w")
    status = _status(emulator, JOBS)
    assert (status["active"], status["terminating"]) == (0, 1)
    assert len(emulator.pods_of(JOBS, NS, "w")) == 1
    await emulator.finish_termination(NS)
    assert emulator.pods_of(JOBS, NS, "w") == []


async def test_an_lws_group_with_one_unready_worker_is_not_a_ready_replica(
    emulator: KubeEmulator,
):
    spec = {
        "replicas": 2,
        "leaderWorkerTemplate": {"size": 3, "workerTemplate": TEMPLATE},
    }
    await _workload(emulator, LWS, "LeaderWorkerSet", spec)
    await emulator.start_lws_group(NS, "w", 0)
    names = await emulator.start_lws_group(NS, "w", 1, unready_workers=1)
    assert names == ["w-1", "w-1-1", "w-1-2"]
    status = _status(emulator, LWS)
    assert (status["replicas"], status["readyReplicas"]) == (2, 1)
    worker = emulator.read(PODS, NS, "w-1-2")
    assert worker is not None
    assert worker["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/worker-index"] == "2"
    await emulator.set_pod_ready(NS, "w-1-2")
    assert _status(emulator, LWS)["readyReplicas"] == 2


async def test_deleting_a_workload_leaves_its_pods_terminating(emulator: KubeEmulator):
    await _workload(emulator, DEPLOYMENTS, "Deployment", {"replicas": 1, "template": TEMPLATE})
    (name,) = await emulator.start_pods(DEPLOYMENTS, NS, "w")
    await emulator.delete_object(DEPLOYMENTS, NS, "w")
    assert emulator.read(DEPLOYMENTS, NS, "w") is None
    pod = emulator.read(PODS, NS, name)
    assert pod is not None and pod["metadata"]["deletionTimestamp"]
    await emulator.finish_termination(NS)
    assert emulator.all(PODS, NS) == []
