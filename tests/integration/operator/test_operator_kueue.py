"""The operator as a Kueue job integration, against the emulated API server.

The tests play Kueue's part (its scheduler and workload controller) by writing the Workload's
status and ``spec.active`` the way Kueue does; the operator's part is the real one: a queued run
is created suspended and starts on admission, an eviction suspends it and gives the quota back
on the same Workload, which Kueue's requeue readmits; ``PodsReady``, priority, flavors'
tolerations and pod set updates, deactivation, ``spec.suspend`` and both Workload versions.
The run's own ``spec.suspend`` tells whether Kueue holds it (the operator writes it, marked
``aflowrl.io/suspended-by: kueue``), as Kueue's job integrations keep their jobs'; a user's
suspend (unmarked) deactivates the Workload and is never turned off by the operator.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from operator_harness import (
    DEPLOYMENTS,
    JOBS,
    NAMESPACE,
    POD_SETS,
    PODS,
    QUEUE,
    RUNS,
    STATEFULSETS,
    TINY,
    Cluster,
    Operator,
    admit,
    admitted_status,
    chart_denies,
    events,
    finish,
    local_queue,
    status_condition,
)

pytestmark = pytest.mark.timeout(180)

V1BETA2 = "kueue.x-k8s.io/v1beta2"
V1BETA1 = "kueue.x-k8s.io/v1beta1"
KUEUE_GROUPS = {"kueue.x-k8s.io", "scheduling.k8s.io"}
TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _workload(cluster: Cluster, version: str = V1BETA2) -> dict[str, Any] | None:
    return cluster.child(f"{version}/workloads", "demo-kueue")


def _admitted() -> dict[str, Any]:
    """Kueue's admission of the run on flavor h100."""
    return admitted_status("h100")


def _evicted(reason: str = "Preempted", message: str | None = None) -> dict[str, Any]:
    """Kueue's eviction of the admitted run (``message``: the reason in lower case)."""
    evicted = _admitted()
    evicted["conditions"].append(
        {
            "type": "Evicted",
            "status": "True",
            "reason": reason,
            "message": reason.lower() if message is None else message,
        }
    )
    return evicted


async def _flavor(cluster: Cluster, version: str = V1BETA2) -> None:
    await cluster.emulator.put_object(
        f"{version}/resourceflavors",
        {
            "apiVersion": version,
            "kind": "ResourceFlavor",
            "metadata": {"name": "h100"},
            "spec": {"nodeLabels": {"cloud.example.com/pool": "h100"}, "tolerations": [TAINT]},
        },
    )


async def _admit(cluster: Cluster, version: str = V1BETA2, **extra: Any) -> None:
    """Kueue's part: admit the run's Workload on flavor h100 (which Kueue only admits on when
    it exists)."""
    if cluster.emulator.read(f"{version}/resourceflavors", None, "h100") is None:
        await _flavor(cluster, version)
    await admit(cluster, admitted_status("h100", **extra), f"{version}/workloads")


RUN_PODS = {"rollout": 1, "learner": 1, "environment": 2, "trainer": 1}


async def _pod(
    cluster: Cluster, name: str, component: str, *, ready: bool, terminating: bool = False
) -> None:
    """One pod of the run as the kubelet shows it: Running, ready or not, terminating or not
    (``deletionTimestamp`` set, its containers still running within their grace period)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NAMESPACE,
        "labels": {"aflowrl.io/run": "demo", "app.kubernetes.io/component": component},
    }
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        meta["deletionGracePeriodSeconds"] = 30
    ready_status = "True" if ready else "False"
    await cluster.emulator.put_object(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {"containers": [{"name": "main", "image": "x"}]},
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": ready_status}],
            },
        },
    )


async def _pods(cluster: Cluster, *, ready: bool) -> None:
    """The kubelet's and controllers' part: every pod of the run ready (or every pod gone)."""
    for component, count in RUN_PODS.items():
        for i in range(count):
            name = f"demo-{component}-{i}"
            if ready:
                await _pod(cluster, name, component, ready=True)
            elif cluster.emulator.read(PODS, NAMESPACE, name) is not None:
                await cluster.emulator.delete_object(PODS, NAMESPACE, name)
    n = 1 if ready else 0
    await cluster.emulator.set_status(JOBS, NAMESPACE, "demo-trainer", {"active": n, "ready": n})
    for resource, name, count in (
        (DEPLOYMENTS, "demo-rollout", 1),
        (STATEFULSETS, "demo-learner", 1),
        (DEPLOYMENTS, "demo-env", 2),
    ):
        await cluster.emulator.set_status(
            resource, NAMESPACE, name, {"readyReplicas": count * n, "replicas": count * n}
        )


async def _running(cluster: Cluster) -> dict[str, Any]:
    """Run ``demo`` (:data:`TINY`, queued) created, admitted by Kueue, and every pod of it
    ready; returns its Workload as first created."""
    await cluster.create_run("demo", TINY, labels=QUEUE)
    workload: dict[str, Any] = await cluster.eventually(
        lambda: _workload(cluster), what="the Workload"
    )
    await _admit(cluster)
    await _pods(cluster, ready=True)
    return workload


async def _pods_ready(cluster: Cluster, version: str = V1BETA2) -> None:
    """Wait until the run's Workload says PodsReady (what Kueue's waitForPodsReady waits for)."""
    await cluster.eventually(
        lambda: status_condition(_workload(cluster, version), "PodsReady").get("status") == "True",
        what="PodsReady",
    )


async def _lose_a_pod(cluster: Cluster, replicas: int) -> None:
    """The environment Deployment (``replicas`` wanted) has one ready pod, below what Kueue
    admitted: wait until the Workload's PodsReady is False, waiting for recovery."""
    await cluster.emulator.set_status(
        DEPLOYMENTS, NAMESPACE, "demo-env", {"readyReplicas": 1, "replicas": replicas}
    )
    await cluster.eventually(
        lambda: (
            status_condition(_workload(cluster), "PodsReady").get("reason") == "WaitForRecovery"
        ),
        what="PodsReady False",
    )


async def _priority_class(
    cluster: Cluster, name: str, value: int, *, workload: bool = False
) -> None:
    """A PriorityClass (Kubernetes'), or with ``workload`` a Kueue WorkloadPriorityClass."""
    api, kind, plural = (
        (V1BETA2, "WorkloadPriorityClass", "workloadpriorityclasses")
        if workload
        else ("scheduling.k8s.io/v1", "PriorityClass", "priorityclasses")
    )
    await cluster.emulator.put_object(
        f"{api}/{plural}",
        {"apiVersion": api, "kind": kind, "metadata": {"name": name}, "value": value},
    )


MARKER = "aflowrl.io/suspended-by"


def _suspend(cluster: Cluster) -> tuple[bool, str | None]:
    """The run's ``spec.suspend`` and who suspended it (the operator's marker)."""
    run = cluster.run("demo")
    annotations = run["metadata"].get("annotations") or {}
    return bool(run["spec"].get("suspend")), annotations.get(MARKER)


async def test_a_queued_run_is_created_suspended_and_starts_only_on_admission(cluster: Cluster):
    await _flavor(cluster)
    await _priority_class(cluster, "high", 1000, workload=True)
    labels = {**QUEUE, "kueue.x-k8s.io/priority-class": "high"}
    await cluster.create_run("demo", TINY, labels=labels)
    workload = await cluster.eventually(lambda: _workload(cluster), what="the Workload")
    assert workload["apiVersion"] == V1BETA2  # the version the cluster serves
    assert workload["spec"]["queueName"] == "team-a"
    assert [ps["name"] for ps in workload["spec"]["podSets"]] == list(POD_SETS)
    # The priority Kueue orders by, and the class it came from.
    assert workload["spec"]["priority"] == 1000
    assert workload["spec"]["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "high",
    }
    # Created suspended: nothing runs before Kueue admits the run, and the run says so.
    await cluster.eventually(lambda: cluster.child(JOBS, "demo-trainer"), what="the Job")
    await cluster.eventually(lambda: _suspend(cluster) == (True, "kueue"), what="suspended")
    assert cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is True
    assert cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["replicas"] == 0
    assert cluster.child(STATEFULSETS, "demo-learner")["spec"]["replicas"] == 0
    ready = await cluster.wait_condition("demo", "Ready", reason="Queued")
    assert "waiting for Kueue to admit the run (queue team-a)" in ready["message"]
    assert cluster.condition("demo", "Admitted")["reason"] == "Queued"
    pods_ready = await cluster.eventually(
        lambda: status_condition(_workload(cluster), "PodsReady"), what="PodsReady"
    )
    assert (pods_ready["status"], pods_ready["reason"]) == ("False", "WaitForStart")
    # Still queued after more passes.
    await cluster.settle()
    assert cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is True

    # Admission, with an admission check's pod set update for the trainer.
    update = {
        "name": "trainer",
        "labels": {"team": "a"},
        "annotations": {"checked-by": "provisioning"},
        "nodeSelector": {"zone": "z1"},
        "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
    }
    checks = [{"name": "prov", "state": "Ready", "message": "", "podSetUpdates": [update]}]
    await _admit(cluster, admissionChecks=checks)
    await cluster.wait_condition("demo", "Ready", reason="ComponentsStarting")
    await cluster.eventually(lambda: _suspend(cluster) == (False, None), what="unsuspended")
    rollout = cluster.child(DEPLOYMENTS, "demo-rollout")
    assert rollout["spec"]["replicas"] == 1
    pod = rollout["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.example.com/pool": "h100"}  # the flavor's nodes
    assert TAINT in pod["tolerations"]  # and its tolerations
    trainer = cluster.child(JOBS, "demo-trainer")["spec"]["template"]
    assert trainer["spec"]["nodeSelector"] == {"cloud.example.com/pool": "h100", "zone": "z1"}
    assert {"key": "spot", "operator": "Exists", "effect": "NoSchedule"} in trainer["spec"][
        "tolerations"
    ]
    assert trainer["metadata"]["labels"]["team"] == "a"
    assert trainer["metadata"]["annotations"]["checked-by"] == "provisioning"
    # The Workload's pod sets stay as created: Kueue's placement is not written back.
    assert _workload(cluster)["spec"]["podSets"] == workload["spec"]["podSets"]
    assert cluster.condition("demo", "Admitted")["status"] == "True"
    admitted = await cluster.eventually(lambda: events(cluster, "Admitted"), what="an Event")
    assert "h100" in admitted[0]["message"] and admitted[0]["type"] == "Normal"

    # PodsReady once every pod of the run is ready (what waitForPodsReady waits for).
    await _pods(cluster, ready=True)
    await _pods_ready(cluster)
    assert status_condition(_workload(cluster), "PodsReady")["reason"] == "Started"
    # A pod lost: False, waiting for recovery.
    await _lose_a_pod(cluster, replicas=2)
    assert cluster.emulator.count_created("workloads") == 1


async def test_an_eviction_suspends_the_run_and_kueue_requeues_the_same_workload(
    cluster: Cluster,
):
    uid = (await _running(cluster))["metadata"]["uid"]
    await cluster.wait_condition("demo", "Ready", status="True")

    # Kueue preempts the run.
    await cluster.emulator.set_status(f"{V1BETA2}/workloads", NAMESPACE, "demo-kueue", _evicted())
    ready = await cluster.wait_condition("demo", "Ready", reason="Evicted")
    assert "evicted by Kueue (Preempted): preempted" in ready["message"]
    assert cluster.condition("demo", "Admitted")["reason"] == "Evicted"
    warnings = await cluster.eventually(
        lambda: [e for e in events(cluster, "Evicted") if e["type"] == "Warning"],
        what="an eviction Event",
    )
    assert "(Preempted): preempted" in warnings[0]["message"]  # Kueue's reason and message
    await cluster.eventually(
        lambda: cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is True, what="suspended"
    )
    assert cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["replicas"] == 0
    # While pods still run, the quota stays reserved.
    await cluster.settle()
    assert _workload(cluster)["status"].get("admission") is not None

    # Every pod gone: the quota is given back on the same Workload, which Kueue requeues.
    await _pods(cluster, ready=False)
    released = await cluster.eventually(
        lambda: (w := _workload(cluster)) and "admission" not in w["status"] and w,
        what="the quota released",
    )
    assert released["metadata"]["uid"] == uid
    assert status_condition(released, "QuotaReserved")["status"] == "False"
    assert status_condition(released, "Admitted")["status"] == "False"
    assert (
        status_condition(released, "Requeued")["status"],
        status_condition(released, "Requeued")["reason"],
    ) == (
        "True",
        "Preempted",
    )
    await cluster.eventually(lambda: events(cluster, "Requeued"), what="a Requeued Event")

    # Kueue readmits the same Workload (its scheduler clears Evicted): the run resumes.
    await _admit(cluster)
    await cluster.wait_condition("demo", "Ready", reason="ComponentsStarting")
    assert cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["replicas"] == 1
    assert _workload(cluster)["metadata"]["uid"] == uid
    assert cluster.emulator.count_created("workloads") == 1
    assert cluster.emulator.count_writes("DELETE", "workloads") == 0

    # The run finishes: its Workload is marked Finished (Kueue frees the quota), not deleted.
    await finish(cluster)
    assert _workload(cluster)["metadata"]["uid"] == uid


async def test_a_deactivated_workload_keeps_the_run_suspended(cluster: Cluster):
    await cluster.create_run("demo", TINY, labels=QUEUE)
    await cluster.eventually(lambda: _workload(cluster), what="the Workload")
    await _admit(cluster)
    # Kueue's backoff limit is reached: it deactivates the Workload and evicts it.
    await cluster.emulator.patch_object(
        f"{V1BETA2}/workloads", NAMESPACE, "demo-kueue", {"spec": {"active": False}}
    )
    evicted = _evicted(
        "Deactivated",
        "The workload is deactivated due to exceeding the maximum number of re-queuing retries",
    )
    await cluster.emulator.set_status(f"{V1BETA2}/workloads", NAMESPACE, "demo-kueue", evicted)
    ready = await cluster.wait_condition("demo", "Ready", reason="Deactivated")
    assert "deactivated by Kueue" in ready["message"]
    assert cluster.condition("demo", "Progressing")["reason"] == "Deactivated"
    assert cluster.condition("demo", "Admitted")["reason"] == "Deactivated"
    await cluster.eventually(
        lambda: cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is True, what="suspended"
    )
    await cluster.eventually(
        lambda: "admission" not in _workload(cluster)["status"], what="the quota released"
    )
    # The operator never turns a deactivation by Kueue back on.
    await cluster.settle()
    assert _workload(cluster)["spec"]["active"] is False
    assert cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is True
    assert cluster.emulator.count_created("workloads") == 1


async def test_spec_suspend_deactivates_the_workload_and_resuming_reactivates_it(
    cluster: Cluster,
):
    await cluster.create_run("demo", TINY, labels=QUEUE)
    workload = await cluster.eventually(lambda: _workload(cluster), what="the Workload")
    await _admit(cluster)
    await cluster.patch_spec("demo", {"suspend": True})
    await cluster.eventually(
        lambda: _workload(cluster)["spec"].get("active") is False, what="deactivated"
    )
    await cluster.wait_condition("demo", "Ready", reason="Suspended")
    assert cluster.condition("demo", "Admitted")["reason"] == "Suspended"
    assert cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is True
    await cluster.patch_spec("demo", {"suspend": False})
    await cluster.eventually(
        lambda: _workload(cluster)["spec"].get("active") is True, what="reactivated"
    )
    assert "aflowrl.io/deactivated-for-suspend" not in (
        _workload(cluster)["metadata"].get("annotations") or {}
    )
    assert _workload(cluster)["metadata"]["uid"] == workload["metadata"]["uid"]


async def test_a_refused_workload_keeps_the_run_held_and_says_why(cluster: Cluster):
    cluster.emulator.fail_next("PATCH", "workloads", 422, times=10_000)
    await cluster.create_run("demo", TINY, labels=QUEUE)
    degraded = await cluster.wait_condition("demo", "Degraded", reason="ChildRejected")
    assert "Workload demo-kueue" in degraded["message"]
    assert "the Workload was refused" in cluster.condition("demo", "Ready")["message"]
    assert cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is True
    cluster.emulator.clear_failures()
    await cluster.patch_spec("demo", {"trainer": {"iterations": 7}})  # any change: a new pass
    await cluster.eventually(lambda: _workload(cluster), what="the Workload")
    await cluster.wait_condition("demo", "Ready", reason="Queued")


async def test_a_cluster_with_kueue_v1beta1_only_gets_v1beta1_workloads(
    cluster_kueue_v1beta1: Cluster,
):
    cluster = cluster_kueue_v1beta1
    await _flavor(cluster, V1BETA1)
    await _priority_class(cluster, "training", 500)
    spec = {**TINY, "scheduling": {"priorityClassName": "training"}}
    await cluster.create_run("demo", spec, labels=QUEUE)
    workload = await cluster.eventually(lambda: _workload(cluster, V1BETA1), what="Workload")
    assert workload["apiVersion"] == V1BETA1
    assert workload["spec"]["priorityClassName"] == "training"
    assert workload["spec"]["priorityClassSource"] == "scheduling.k8s.io/priorityclass"
    assert workload["spec"]["priority"] == 500
    await _admit(cluster, V1BETA1)
    rollout = cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["template"]["spec"]
    assert rollout["nodeSelector"] == {"cloud.example.com/pool": "h100"}
    assert TAINT in rollout["tolerations"]
    await _pods(cluster, ready=True)
    await _pods_ready(cluster, V1BETA1)


async def test_the_chart_grants_every_kueue_request_the_operator_makes(cluster: Cluster):
    """Drive every Kueue path (priority, flavors, PodsReady, eviction, requeue, suspend,
    Finished), then check each request against the chart's default RBAC."""
    await _flavor(cluster)
    await _priority_class(cluster, "training", 5)
    spec = {**TINY, "scheduling": {"priorityClassName": "training"}}
    await cluster.create_run("demo", spec, labels=QUEUE)
    await cluster.eventually(lambda: _workload(cluster), what="the Workload")
    await _admit(cluster)
    await _pods(cluster, ready=True)
    await _pods_ready(cluster)
    await cluster.emulator.set_status(f"{V1BETA2}/workloads", NAMESPACE, "demo-kueue", _evicted())
    await _pods(cluster, ready=False)
    await cluster.eventually(
        lambda: "admission" not in _workload(cluster)["status"], what="the quota released"
    )
    await _admit(cluster)  # readmitted: the run's spec.suspend is the user's again
    await cluster.patch_spec("demo", {"suspend": True})
    await cluster.eventually(
        lambda: _workload(cluster)["spec"].get("active") is False, what="deactivated"
    )
    await cluster.patch_spec("demo", {"suspend": False})
    await _admit(cluster)
    await finish(cluster)

    made = {r for r in cluster.emulator.operator_requests() if r[1] in KUEUE_GROUPS}
    assert {
        ("get", "kueue.x-k8s.io", "resourceflavors"),
        ("get", "scheduling.k8s.io", "priorityclasses"),
        ("patch", "kueue.x-k8s.io", "workloads"),
        ("patch", "kueue.x-k8s.io", "workloads/status"),
        ("watch", "kueue.x-k8s.io", "workloads"),
    } <= made
    denied = chart_denies(made)
    assert denied == [], f"the chart's RBAC refuses requests the operator makes: {denied}"


async def test_spec_suspend_says_whether_kueue_holds_the_run_and_a_user_suspend_is_kept(
    cluster: Cluster,
):
    await cluster.create_run("demo", TINY, labels=QUEUE)
    # Queued: suspended by the operator as Kueue's job integration, from its first pass.
    await cluster.eventually(lambda: _suspend(cluster) == (True, "kueue"), what="suspended")
    workload = await cluster.eventually(lambda: _workload(cluster), what="the Workload")
    uid = workload["metadata"]["uid"]
    await cluster.wait_condition("demo", "Ready", reason="Queued")  # not the user's Suspended
    assert workload["spec"].get("active", True) is True  # the operator's suspend stays queued
    assert cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["replicas"] == 0
    template = cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["template"]["metadata"]
    pod_hash = template["annotations"]["aflowrl.io/spec-hash"]

    # Admission: spec.suspend false, the marker gone, the run scales up.
    await _admit(cluster)
    await cluster.eventually(lambda: _suspend(cluster) == (False, None), what="unsuspended")
    await cluster.eventually(
        lambda: cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["replicas"] == 1,
        what="scaled up",
    )
    # The write of spec.suspend changes no pod template (no restart, no hash change).
    template = cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["template"]["metadata"]
    assert template["annotations"]["aflowrl.io/spec-hash"] == pod_hash
    await _pods(cluster, ready=True)

    # Eviction: suspended again by the operator, every component to zero.
    await cluster.emulator.set_status(f"{V1BETA2}/workloads", NAMESPACE, "demo-kueue", _evicted())
    await cluster.eventually(lambda: _suspend(cluster) == (True, "kueue"), what="re-suspended")
    await cluster.eventually(
        lambda: (
            cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["replicas"] == 0
            and cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is True
        ),
        what="scaled to zero",
    )
    await _pods(cluster, ready=False)
    await cluster.eventually(
        lambda: "admission" not in _workload(cluster)["status"], what="the quota released"
    )
    assert _suspend(cluster) == (True, "kueue")

    # Kueue requeues and readmits the same Workload: unsuspended again.
    await _admit(cluster)
    await cluster.eventually(lambda: _suspend(cluster) == (False, None), what="resumed")
    assert _workload(cluster)["metadata"]["uid"] == uid
    await _pods(cluster, ready=True)

    # The user suspends the admitted run: the Workload is deactivated and the user's suspend
    # is never turned off by the operator.
    await cluster.patch_spec("demo", {"suspend": True})
    await cluster.eventually(
        lambda: _workload(cluster)["spec"].get("active") is False, what="deactivated"
    )
    await cluster.wait_condition("demo", "Ready", reason="Suspended")
    await cluster.settle()
    assert _suspend(cluster) == (True, None)
    assert cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["replicas"] == 0

    # The user resumes: the Workload is reactivated, the run waits for (re)admission and
    # resumes on it.
    await _pods(cluster, ready=False)
    await cluster.emulator.set_status(
        f"{V1BETA2}/workloads", NAMESPACE, "demo-kueue", {"conditions": []}
    )
    await cluster.patch_spec("demo", {"suspend": False})
    await cluster.eventually(
        lambda: _workload(cluster)["spec"].get("active", True) is True, what="reactivated"
    )
    await cluster.eventually(lambda: _suspend(cluster) == (True, "kueue"), what="queued again")
    await _admit(cluster)
    await cluster.eventually(lambda: _suspend(cluster) == (False, None), what="readmitted")
    await cluster.eventually(
        lambda: cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["replicas"] == 1,
        what="scaled up again",
    )
    assert _workload(cluster)["metadata"]["uid"] == uid
    assert cluster.emulator.count_created("workloads") == 1
    # The operator wrote spec.suspend on the run itself (not its status) as its field manager.
    managers = {m.get("manager") for m in cluster.run("demo")["metadata"].get("managedFields", [])}
    assert "aflowrl-operator" in managers


async def test_removing_the_marker_makes_a_queued_runs_suspend_the_users(cluster: Cluster):
    await cluster.create_run("demo", TINY, labels=QUEUE)
    await cluster.eventually(lambda: _suspend(cluster) == (True, "kueue"), what="suspended")
    await cluster.eventually(lambda: _workload(cluster), what="the Workload")
    # The user takes the queued run's suspend over: the Workload is deactivated (no quota is
    # asked for), and Kueue's admission would not start the run.
    await cluster.emulator.patch_object(
        RUNS, NAMESPACE, "demo", {"metadata": {"annotations": {MARKER: None}}}
    )
    await cluster.eventually(
        lambda: _workload(cluster)["spec"].get("active") is False, what="deactivated"
    )
    await cluster.wait_condition("demo", "Admitted", reason="Suspended")
    await cluster.settle()
    assert _suspend(cluster) == (True, None)
    assert cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is True


async def test_an_evicted_runs_quota_is_held_while_any_pod_runs_unready_or_terminating(
    cluster: Cluster,
):
    await _running(cluster)
    await cluster.emulator.set_status(f"{V1BETA2}/workloads", NAMESPACE, "demo-kueue", _evicted())
    await cluster.eventually(
        lambda: cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["replicas"] == 0,
        what="scaled to zero",
    )
    # Every workload reports nothing ready and the trainer nothing active, but a vLLM pod is
    # still in its startup probe (running, not ready) and a learner pod is terminating.
    await _pods(cluster, ready=False)
    await _pod(cluster, "demo-rollout-slow", "rollout", ready=False)
    await _pod(cluster, "demo-learner-old", "learner", ready=True, terminating=True)
    await cluster.settle()
    assert _workload(cluster)["status"].get("admission") is not None, "quota released early"
    await cluster.emulator.delete_object(PODS, NAMESPACE, "demo-rollout-slow")
    await cluster.settle()
    assert _workload(cluster)["status"].get("admission") is not None, "a pod still terminates"
    # The terminating pod's containers are gone: only now is the quota given back.
    await cluster.emulator.set_status(PODS, NAMESPACE, "demo-learner-old", {"phase": "Succeeded"})
    await cluster.eventually(
        lambda: "admission" not in _workload(cluster)["status"], what="the quota released"
    )


async def test_the_workload_of_a_deleted_run_keeps_its_quota_until_its_pods_are_gone(
    cluster: Cluster,
):
    workload = await _running(cluster)
    # Kueue's resource-in-use finalizer, as its jobframework puts on its own jobs' Workloads.
    assert "kueue.x-k8s.io/resource-in-use" in workload["metadata"]["finalizers"]
    await cluster.emulator.delete_object(RUNS, NAMESPACE, "demo")
    # The garbage collector deletes the Workload, but its finalizer holds it (and the quota)
    # while the run's pods terminate.
    await cluster.eventually(
        lambda: _workload(cluster)["metadata"].get("deletionTimestamp"), what="being deleted"
    )
    await cluster.emulator.delete_object(PODS, NAMESPACE, "demo-rollout-0")
    await cluster.emulator.delete_object(PODS, NAMESPACE, "demo-learner-0")
    await asyncio.sleep(1.0)  # events of the pods above reach the operator (not a deadline)
    assert _workload(cluster) is not None, "the Workload went while pods still ran"
    for pod in ("demo-environment-0", "demo-environment-1", "demo-trainer-0"):
        await cluster.emulator.delete_object(PODS, NAMESPACE, pod)
    await cluster.eventually(lambda: _workload(cluster) is None, what="the Workload gone")


async def test_a_reshaped_runs_workload_is_replaced_only_once_its_pods_are_gone(
    cluster: Cluster,
):
    workload = await _running(cluster)
    # A new shape (more environment pods): Kueue does not let pod sets change.
    await cluster.patch_spec("demo", {"environment": {"replicas": {"min": 2, "max": 6}}})
    await cluster.eventually(
        lambda: cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["replicas"] == 0,
        what="the run held",
    )
    await _pods(cluster, ready=False)
    await _pod(cluster, "demo-env-old", "environment", ready=False, terminating=True)
    await cluster.settle()
    live = _workload(cluster)
    assert live is not None and live["metadata"]["uid"] == workload["metadata"]["uid"]
    await cluster.emulator.delete_object(PODS, NAMESPACE, "demo-env-old")
    await cluster.eventually(
        lambda: (w := _workload(cluster)) and w["metadata"]["uid"] != workload["metadata"]["uid"],
        what="a new Workload",
    )
    assert cluster.emulator.count_created("workloads") == 2


async def test_relabelling_an_admitted_run_is_refused_and_it_keeps_its_queue_and_quota(
    cluster: Cluster,
):
    await _running(cluster)
    # Taking the run out of its queue (the chart's admission policy refuses this on a real
    # API server; the emulator has none): the operator refuses to act on it.
    await cluster.emulator.patch_object(
        RUNS, NAMESPACE, "demo", {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": None}}}
    )
    degraded = await cluster.wait_condition("demo", "Degraded", reason="QueueNameImmutable")
    assert "'team-a'" in degraded["message"]
    await cluster.settle()
    workload = _workload(cluster)
    assert workload["spec"]["queueName"] == "team-a"
    assert workload["status"].get("admission") is not None
    assert cluster.condition("demo", "Admitted")["status"] == "True"
    # Kueue still decides: an eviction stops the unlabelled run as before.
    await cluster.emulator.set_status(f"{V1BETA2}/workloads", NAMESPACE, "demo-kueue", _evicted())
    await cluster.eventually(
        lambda: cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["replicas"] == 0,
        what="the run stopped",
    )
    # Moved to another queue while running: refused the same way.
    await cluster.emulator.patch_object(
        RUNS, NAMESPACE, "demo", {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "b"}}}
    )
    await cluster.eventually(
        lambda: "changed to 'b'" in cluster.condition("demo", "Degraded")["message"],
        what="the change refused",
    )
    assert cluster.emulator.count_created("workloads") == 1


async def test_a_run_without_a_queue_gets_the_namespaces_default_local_queue(cluster: Cluster):
    await cluster.emulator.put_object(
        f"{V1BETA2}/localqueues", local_queue(f"{V1BETA2}/localqueues", NAMESPACE, "default")
    )
    await cluster.create_run("demo", TINY)
    workload = await cluster.eventually(lambda: _workload(cluster), what="the Workload")
    assert workload["spec"]["queueName"] == "default"
    labels = cluster.run("demo")["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "default"
    await cluster.eventually(lambda: _suspend(cluster) == (True, "kueue"), what="suspended")
    assert cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["replicas"] == 0
    await _admit(cluster)
    await cluster.eventually(lambda: _suspend(cluster) == (False, None), what="unsuspended")


async def test_a_missing_local_queue_is_reported_and_the_run_stays_queued(cluster: Cluster):
    await cluster.create_run("demo", TINY, labels={"kueue.x-k8s.io/queue-name": "nowhere"})
    degraded = await cluster.wait_condition("demo", "Degraded", reason="LocalQueueMissing")
    assert "LocalQueue nowhere does not exist in namespace team-a" in degraded["message"]
    assert cluster.condition("demo", "Admitted")["reason"] == "Queued"
    assert cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is True


async def test_with_manage_jobs_without_queue_name_an_unlabelled_run_is_held(cluster: Cluster):
    await cluster.stop_operator()
    cluster.operator = Operator(cluster.url)
    cluster.operator.config = dataclasses.replace(
        cluster.operator.config, manage_runs_without_queue_name=True
    )
    await cluster.start_operator()
    await cluster.create_run("demo", TINY)
    admitted = await cluster.wait_condition("demo", "Admitted", reason="NoQueueName")
    assert "manageJobsWithoutQueueName" in admitted["message"]
    await cluster.eventually(lambda: _suspend(cluster) == (True, "kueue"), what="suspended")
    assert cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["replicas"] == 0
    assert cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is True
    # Naming a queue queues it.
    await cluster.emulator.patch_object(RUNS, NAMESPACE, "demo", {"metadata": {"labels": QUEUE}})
    workload = await cluster.eventually(lambda: _workload(cluster), what="the Workload")
    assert workload["spec"]["queueName"] == "team-a"


async def test_an_unreadable_flavor_keeps_the_admitted_run_suspended_and_names_it(
    cluster: Cluster,
):
    await cluster.create_run("demo", TINY, labels=QUEUE)
    await cluster.eventually(lambda: _workload(cluster), what="the Workload")
    # Admitted on flavor h100, which does not exist (or the operator may not read it).
    await cluster.emulator.set_status(f"{V1BETA2}/workloads", NAMESPACE, "demo-kueue", _admitted())
    admitted = await cluster.wait_condition("demo", "Admitted", reason="PlacementFailed")
    assert "ResourceFlavor h100 does not exist" in admitted["message"]
    assert cluster.condition("demo", "Degraded")["reason"] == "PlacementFailed"
    await cluster.settle()
    assert cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is True
    assert cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["replicas"] == 0
    assert _suspend(cluster) == (True, "kueue")
    # The flavor appears: the run starts on its nodes.
    await _flavor(cluster)
    await cluster.eventually(
        lambda: cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is False, what="started"
    )
    pod = cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.example.com/pool": "h100"}


async def test_a_flavor_conflicting_with_the_users_node_selector_keeps_the_run_suspended(
    cluster: Cluster,
):
    await _flavor(cluster)
    spec = {**TINY, "rollout": {"pod": {"nodeSelector": {"cloud.example.com/pool": "a100"}}}}
    await cluster.create_run("demo", spec, labels=QUEUE)
    await cluster.eventually(lambda: _workload(cluster), what="the Workload")
    await cluster.emulator.set_status(f"{V1BETA2}/workloads", NAMESPACE, "demo-kueue", _admitted())
    admitted = await cluster.wait_condition("demo", "Admitted", reason="PlacementFailed")
    assert (
        "pod set rollout: nodeSelector cloud.example.com/pool=a100 conflicts with "
        "cloud.example.com/pool=h100" in admitted["message"]
    )
    await cluster.settle()
    assert cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is True
    assert cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["replicas"] == 0


async def test_pods_ready_is_measured_against_the_admitted_counts_not_an_autoscale(
    cluster: Cluster,
):
    await _running(cluster)
    await _pods_ready(cluster)
    # The HPA scales the environment up: two new pods start, not ready yet.
    await cluster.emulator.patch_object(
        DEPLOYMENTS, NAMESPACE, "demo-env", {"spec": {"replicas": 4}}
    )
    await cluster.emulator.set_status(
        DEPLOYMENTS, NAMESPACE, "demo-env", {"readyReplicas": 2, "replicas": 4}
    )
    await cluster.settle()
    assert cluster.child(DEPLOYMENTS, "demo-env")["spec"]["replicas"] == 4
    assert status_condition(_workload(cluster), "PodsReady")["status"] == "True"
    # Below the floor the run admitted: that is a lost pod.
    await _lose_a_pod(cluster, replicas=4)


async def test_a_priority_class_change_reaches_the_admitted_workload_and_the_deadline_bounds_it(
    cluster: Cluster,
):
    for name, value in (("low", 10), ("high", 1000)):
        await _priority_class(cluster, name, value, workload=True)
    await _flavor(cluster)
    spec = {**TINY, "trainer": {"activeDeadlineSeconds": 7200}}
    labels = {**QUEUE, "kueue.x-k8s.io/priority-class": "low"}
    await cluster.create_run("demo", spec, labels=labels)
    workload = await cluster.eventually(lambda: _workload(cluster), what="the Workload")
    # The run's deadline is Kueue's maximum execution time.
    assert workload["spec"]["maximumExecutionTimeSeconds"] == 7200
    assert workload["spec"]["priority"] == 10
    await _admit(cluster)
    await cluster.emulator.patch_object(
        RUNS,
        NAMESPACE,
        "demo",
        {"metadata": {"labels": {"kueue.x-k8s.io/priority-class": "high"}}},
    )
    await cluster.eventually(
        lambda: _workload(cluster)["spec"]["priority"] == 1000, what="the new priority"
    )
    live = _workload(cluster)
    assert live["spec"]["priorityClassRef"]["name"] == "high"
    assert live["status"].get("admission") is not None  # still admitted: no requeue
    assert cluster.emulator.count_created("workloads") == 1


async def test_a_placement_edit_requeues_an_admitted_run_and_a_rendering_change_does_not(
    cluster: Cluster,
):
    workload = await _running(cluster)
    uid = workload["metadata"]["uid"]
    # A Workload written by an older release: another hash, other rendered details (a
    # command), the same counts, requests and placement. Nothing Kueue admitted changed.
    pod_sets = workload["spec"]["podSets"]
    pod_sets[0]["template"]["spec"]["containers"][0]["command"] = ["an", "older", "command"]
    await cluster.emulator.patch_object(
        f"{V1BETA2}/workloads",
        NAMESPACE,
        "demo-kueue",
        {
            "metadata": {"annotations": {"aflowrl.io/podsets-hash": "older-release"}},
            "spec": {"podSets": pod_sets},
        },
    )
    await cluster.settle()
    assert _workload(cluster)["metadata"]["uid"] == uid
    assert cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["replicas"] == 1
    assert cluster.condition("demo", "Admitted")["status"] == "True"
    # The user moves the rollout to other nodes: Kueue never checked that placement, so the
    # run stops, and once its pods are gone a new Workload is admitted.
    await cluster.patch_spec("demo", {"rollout": {"pod": {"nodeSelector": {"rack": "r7"}}}})
    await cluster.eventually(
        lambda: cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["replicas"] == 0,
        what="the run held",
    )
    await _pods(cluster, ready=False)
    fresh = await cluster.eventually(
        lambda: (w := _workload(cluster)) and w["metadata"]["uid"] != uid and w,
        what="a new Workload",
    )
    rollout = next(ps for ps in fresh["spec"]["podSets"] if ps["name"] == "rollout")
    assert rollout["template"]["spec"]["nodeSelector"]["rack"] == "r7"


async def test_topology_aware_scheduling_requests_and_gates_the_pod_sets_pods(cluster: Cluster):
    await _flavor(cluster)
    rack = {"kueue.x-k8s.io/podset-required-topology": "cloud.example.com/rack"}
    spec = {**TINY, "rollout": {"pod": {"annotations": rack}}}
    await cluster.create_run("demo", spec, labels=QUEUE)
    workload = await cluster.eventually(lambda: _workload(cluster), what="the Workload")
    by_name = {ps["name"]: ps for ps in workload["spec"]["podSets"]}
    assert by_name["rollout"]["topologyRequest"] == {"required": "cloud.example.com/rack"}
    assert "topologyRequest" not in by_name["learner"]
    # Kueue admits the rollout pod set on one rack: its pods start gated, found by Kueue's
    # topology ungater through the pod set label and the Workload annotation.
    admitted = _admitted()
    assignment = {"levels": ["cloud.example.com/rack"], "domains": [{"values": ["r1"], "count": 1}]}
    admitted["admission"]["podSetAssignments"][0]["topologyAssignment"] = assignment
    await cluster.emulator.set_status(f"{V1BETA2}/workloads", NAMESPACE, "demo-kueue", admitted)
    await cluster.eventually(
        lambda: cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["replicas"] == 1,
        what="started",
    )
    template = cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["template"]
    assert template["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/topology"}]
    assert template["metadata"]["labels"]["kueue.x-k8s.io/podset"] == "rollout"
    assert template["metadata"]["annotations"]["kueue.x-k8s.io/workload"] == "demo-kueue"
    learner = cluster.child(STATEFULSETS, "demo-learner")["spec"]["template"]
    assert "schedulingGates" not in learner["spec"]


async def test_a_multikueue_cluster_queue_is_reported_unsupported(cluster: Cluster):
    await cluster.emulator.put_object(
        f"{V1BETA2}/admissionchecks",
        {
            "apiVersion": V1BETA2,
            "kind": "AdmissionCheck",
            "metadata": {"name": "dispatch"},
            "spec": {"controllerName": "kueue.x-k8s.io/multikueue"},
        },
    )
    await cluster.create_run("demo", TINY, labels=QUEUE)
    await cluster.eventually(lambda: _workload(cluster), what="the Workload")
    await cluster.emulator.set_status(
        f"{V1BETA2}/workloads",
        NAMESPACE,
        "demo-kueue",
        {"admissionChecks": [{"name": "dispatch", "state": "Pending", "message": ""}]},
    )
    degraded = await cluster.wait_condition("demo", "Degraded", reason="MultiKueueUnsupported")
    assert "admission check dispatch" in degraded["message"]
    assert cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is True


async def test_a_components_own_priority_class_sets_the_workloads_priority(cluster: Cluster):
    await _priority_class(cluster, "training", 500)
    spec = {**TINY, "learner": {"pod": {"priorityClassName": "training"}}}
    await cluster.create_run("demo", spec, labels=QUEUE)
    workload = await cluster.eventually(lambda: _workload(cluster), what="the Workload")
    # As Kueue's ExtractPriority: the first pod set whose pods name a PriorityClass.
    assert workload["spec"]["priority"] == 500
    assert workload["spec"]["priorityClassRef"]["name"] == "training"
    learner = next(ps for ps in workload["spec"]["podSets"] if ps["name"] == "learner")
    assert learner["template"]["spec"]["priorityClassName"] == "training"
