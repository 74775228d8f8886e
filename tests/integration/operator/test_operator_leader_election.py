"""Two operator replicas against one emulated API server, electing a leader with a
``coordination.k8s.io/v1`` Lease (the chart's RBAC enforced): only the holder writes, each
write that must happen once happens once over a whole run (queued, admitted, evicted,
readmitted, suspended, resumed, finished, deleted), quota is held exactly while the run's pods
exist, and the other replica takes over when the leader stops or dies."""

from __future__ import annotations

import copy
import datetime
from collections.abc import AsyncIterator
from typing import Any

import chart_rbac
import kmock
import kubernetes
import pytest
from kube_emulator import COSCHEDULING, KUEUE, MONITORING, PEERING, RESOURCES, KubeEmulator
from operator_harness import (
    DEPLOYMENTS,
    JOBS,
    NAMESPACE,
    QUEUE,
    RUNS,
    STATEFULSETS,
    TEST_LEASE,
    TINY,
    WORKLOADS,
    Cluster,
    Operator,
    admit,
    admitted_status,
    emulated_cluster,
    finish,
)

from aflowrl_operator import leader
from aflowrl_operator.errors import ApiRejectedError
from aflowrl_operator.kube import KubeApi

pytestmark = pytest.mark.timeout(600)

LEASES = "coordination.k8s.io/v1/leases"


def _lease(cluster: Cluster) -> dict[str, Any]:
    return (cluster.emulator.read(LEASES, TEST_LEASE.namespace, TEST_LEASE.name) or {}).get(
        "spec"
    ) or {}


def _actions(cluster: Cluster, action: str) -> int:
    """How many times the operator's Reconciled Events list this write."""
    return sum(
        e["message"].split(", ").count(action)
        for e in cluster.emulator.all("v1/events", NAMESPACE)
        if e["reason"] == "Reconciled"
    )


async def _play_controllers(cluster: Cluster) -> None:
    """The Deployment, StatefulSet and Job controllers catch up with the run's children: pods
    started where replicas are wanted, surplus (or a suspended Job's) pods terminating."""
    for resource, name in (
        (DEPLOYMENTS, "demo-rollout"),
        (STATEFULSETS, "demo-learner"),
        (DEPLOYMENTS, "demo-env"),
        (JOBS, "demo-trainer"),
    ):
        await cluster.emulator.play_controller(resource, NAMESPACE, name)


@pytest.fixture()
async def bare_cluster() -> AsyncIterator[Cluster]:
    """The emulated cluster enforcing the chart's RBAC, without an operator."""
    async with emulated_cluster(
        RESOURCES, MONITORING, KUEUE, COSCHEDULING, PEERING, operator=False
    ) as harness:
        yield harness


async def test_two_operators_make_each_once_only_write_once_over_a_whole_run(
    bare_cluster: Cluster,
):
    cluster = bare_cluster
    first = await cluster.start_elected("aflow-rl-operator-a")
    await cluster.eventually(lambda: _lease(cluster).get("holderIdentity"), what="a leader")
    second = await cluster.start_elected("aflow-rl-operator-b")

    def one_leads() -> tuple[Operator, Operator] | None:
        # The Lease's holder leads once its renewal is in; a replica whose loop a loaded
        # machine starved past the renew deadline steps down until its next renewal.
        holder = _lease(cluster)["holderIdentity"]
        lead, standby = (first, second) if holder == "aflow-rl-operator-a" else (second, first)
        return (lead, standby) if lead.leading() and not standby.leading() else None

    lead, standby = await cluster.eventually(one_leads, what="one replica leading")

    # Queued, admitted, running.
    await cluster.create_run("demo", TINY, labels=QUEUE)
    await cluster.eventually(lambda: cluster.child(WORKLOADS, "demo-kueue"), what="Workload")
    admitted = admitted_status()
    await admit(cluster, admitted)
    await _play_controllers(cluster)
    await cluster.wait_condition("demo", "Ready", status="True")

    async def leader_passes(more: int = 3) -> None:
        target = lead.passes() + more
        await cluster.eventually(lambda: lead.passes() >= target, what="passes of the leader")

    def holds_quota() -> bool:
        return "admission" in (cluster.child(WORKLOADS, "demo-kueue").get("status") or {})

    # Evicted by Kueue (preempted): the run is held, its pods terminate within their grace, and
    # the quota is given back only once the last of them is gone; then Kueue readmits it.
    evicted = copy.deepcopy(admitted)
    evicted["conditions"].append(
        {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "preempted"}
    )
    await cluster.emulator.set_status(WORKLOADS, NAMESPACE, "demo-kueue", evicted)
    await cluster.eventually(
        lambda: cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is True, what="held"
    )
    await cluster.eventually(
        lambda: cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["replicas"] == 0,
        what="scaled to zero",
    )
    await _play_controllers(cluster)
    assert any(
        p["metadata"].get("deletionTimestamp") for p in cluster.emulator.all("v1/pods", NAMESPACE)
    ), "no pod is terminating: the check below would prove nothing"
    await leader_passes()
    assert holds_quota(), "quota released while the run's pods were terminating"
    await cluster.emulator.finish_termination(NAMESPACE)
    await cluster.eventually(lambda: not holds_quota(), what="the quota given back")
    await cluster.emulator.set_status(WORKLOADS, NAMESPACE, "demo-kueue", admitted)
    await cluster.eventually(
        lambda: cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is False, what="readmitted"
    )
    await _play_controllers(cluster)
    await cluster.wait_condition("demo", "Ready", status="True")

    # Suspended and resumed by the user.
    await cluster.patch_spec("demo", {"suspend": True})
    await cluster.eventually(
        lambda: cluster.child(WORKLOADS, "demo-kueue")["spec"].get("active") is False,
        what="the Workload deactivated",
    )
    await cluster.patch_spec("demo", {"suspend": False})
    await cluster.eventually(
        lambda: cluster.child(WORKLOADS, "demo-kueue")["spec"].get("active") is True,
        what="the Workload activated",
    )
    await cluster.emulator.set_status(WORKLOADS, NAMESPACE, "demo-kueue", admitted)
    await cluster.eventually(
        lambda: cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is False, what="resumed"
    )

    # Finished.
    await finish(cluster)
    # The pass's Event comes after its status write: wait for it, then for more passes.
    await cluster.eventually(
        lambda: _actions(cluster, "finished Workload demo-kueue"), what="the Event"
    )
    target = lead.passes() + 3
    await cluster.eventually(lambda: lead.passes() >= target, what="passes of the leader")

    # Each once-only write happened once, all by the leader; the other only watched.
    assert standby.passes() == 0
    assert cluster.emulator.count_created("jobs", "demo-trainer") == 1
    assert cluster.emulator.count_created("workloads", "demo-kueue") == 1
    assert cluster.emulator.count_writes("DELETE", "jobs") == 0
    assert cluster.emulator.count_writes("DELETE", "workloads") == 0
    reporters = {e.get("reportingInstance") for e in cluster.emulator.all("v1/events", NAMESPACE)}
    assert reporters == {lead.config.identity}  # every Event, once, from the leader
    assert _actions(cluster, "created Job demo-trainer") == 1
    assert _actions(cluster, "released Workload demo-kueue") == 1  # once, after the eviction
    assert _actions(cluster, "deactivated Workload demo-kueue") == 1
    assert _actions(cluster, "activated Workload demo-kueue") == 1
    assert _actions(cluster, "finished Workload demo-kueue") == 1
    finished = [
        e
        for e in cluster.emulator.all("v1/events", NAMESPACE)
        if e["message"].startswith("Admitted is False: the run has finished")
    ]
    assert len(finished) == 1
    assert cluster.emulator.refused == []

    # Deleted: nothing is written for it any more, by either replica.
    await cluster.emulator.delete_object(RUNS, NAMESPACE, "demo")
    await cluster.eventually(lambda: cluster.emulator.read(JOBS, NAMESPACE, "demo-trainer") is None)
    assert cluster.emulator.count_created("jobs", "demo-trainer") == 1

    # The leader stops (a rolling update): it releases the Lease, the other takes over at once
    # and catches up on a run created meanwhile.
    await lead.stop()
    await cluster.create_run("next", TINY)
    await cluster.eventually(standby.leading, what="the takeover")
    assert _lease(cluster)["holderIdentity"] == standby.config.identity
    assert _lease(cluster)["leaseTransitions"] == 1
    await cluster.eventually(lambda: cluster.child(JOBS, "next-trainer"), what="the new leader")
    await cluster.eventually(lambda: standby.passes() > 0, what="passes of the new leader")
    assert cluster.emulator.count_created("jobs", "next-trainer") == 1


@pytest.fixture()
async def lease_server() -> AsyncIterator[tuple[KubeEmulator, str]]:
    async with KubeEmulator() as emulator, kmock.Server(emulator) as server:
        emulator.declare(RESOURCES)
        emulator.policy = chart_rbac.operator_policy()
        yield emulator, str(server.url).rstrip("/")


def _api(url: str) -> KubeApi:
    config = kubernetes.client.Configuration()
    config.host = url
    return KubeApi(config, timeout_s=30)


async def _until(check: Any, what: str, within: float = 90.0) -> None:
    import asyncio

    deadline = asyncio.get_running_loop().time() + within
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"


async def test_a_dead_leaders_lease_is_taken_over_only_after_it_expires(
    lease_server: tuple[KubeEmulator, str],
):
    emulator, url = lease_server
    short = leader.LeaseConfig(
        name=TEST_LEASE.name,
        namespace=TEST_LEASE.namespace,
        duration_s=3.0,
        renew_deadline_s=2.0,
        retry_s=0.1,
    )
    a = leader.LeaderElector(_api(url), short, "pod-a")
    b = leader.LeaderElector(_api(url), short, "pod-b")
    assert await a.try_once() and a.leading
    assert not await b.try_once()  # held and fresh
    lease = emulator.read(LEASES, short.namespace, short.name)
    assert lease is not None
    spec = lease["spec"]
    assert spec["holderIdentity"] == "pod-a" and spec["leaseDurationSeconds"] == 3
    assert spec["leaseTransitions"] == 0
    datetime.datetime.strptime(spec["renewTime"], "%Y-%m-%dT%H:%M:%S.%fZ")  # a MicroTime

    # pod-a dies (never renews again): pod-b takes over once the lease expired on its clock.
    seen = lease["metadata"]["resourceVersion"]
    await _until(b.try_once, "the takeover")
    lease = emulator.read(LEASES, short.namespace, short.name)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "pod-b"
    assert lease["spec"]["leaseTransitions"] == 1
    assert not await a.try_once() and not a.leading  # it comes back: it does not lead

    # A write from a replica that read an older Lease is refused (409): the takeover above
    # was a compare-and-swap.
    stale = {"metadata": {"resourceVersion": seen}, "spec": {"holderIdentity": "pod-a"}}
    with pytest.raises(ApiRejectedError) as refused:
        await a.api.patch("Lease", short.namespace, short.name, stale)
    assert refused.value.status == 409
    assert emulator.refused == []  # the chart's Role grants what the election does


async def test_a_released_lease_is_taken_at_once(lease_server: tuple[KubeEmulator, str]):
    emulator, url = lease_server
    long = leader.LeaseConfig(
        name=TEST_LEASE.name, namespace=TEST_LEASE.namespace, duration_s=3600.0,
        renew_deadline_s=1800.0, retry_s=1.0,
    )  # fmt: skip
    a = leader.LeaderElector(_api(url), long, "pod-a")
    b = leader.LeaderElector(_api(url), long, "pod-b")
    assert await a.try_once()
    await a.release()
    assert not a.leading
    assert await b.try_once()  # no waiting for the hour-long lease
    lease = emulator.read(LEASES, long.namespace, long.name)
    assert lease is not None and lease["spec"]["holderIdentity"] == "pod-b"


async def test_leader_election_is_refused_outside_the_charts_lease(
    lease_server: tuple[KubeEmulator, str],
):
    emulator, url = lease_server
    other = leader.LeaseConfig(name="someone-elses", namespace=TEST_LEASE.namespace)
    a = leader.LeaderElector(_api(url), other, "pod-a")
    assert not await a.try_once()  # the Role names the chart's Lease only
    assert not a.leading
    assert emulator.count_refused("get", "leases") == 1
