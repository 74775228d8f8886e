"""A run's life on a shared cluster, with the real operator (kopf) against the emulated API:
deleted while the operator is stopped, a trainer failure's evidence (Events, ``status.lastError``,
kept pods), and drift taken back on the next pass while another manager's fields stay."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from operator_harness import DEPLOYMENTS, JOBS, NAMESPACE, PODS, RUNS, STATEFULSETS, TINY, Cluster

pytestmark = pytest.mark.timeout(120)

LAST_LINE = "ValueError: the environment service went away"
ENDED = "2026-01-01T01:00:00Z"  # long past: a TTL counted from it has run out


def _path(resource: str, name: str) -> str:
    group_version, plural = resource.rsplit("/", 1)
    root = "/api" if group_version == "v1" else "/apis"
    return f"{root}/{group_version}/namespaces/{NAMESPACE}/{plural}/{name}"


async def _merge_patch(cluster: Cluster, resource: str, name: str, patch: dict, manager: str):
    """A write by another client (``kubectl edit``, the autoscaler), under its field manager."""
    async with cluster.server.client.patch(
        _path(resource, name),
        json=patch,
        params={"fieldManager": manager},
        headers={"Content-Type": "application/merge-patch+json"},
    ) as response:
        assert response.status == 200, await response.text()


async def _running(cluster: Cluster, name: str) -> None:
    """Play the controllers: the run's pods are ready and its trainer runs."""
    await cluster.eventually(lambda: cluster.child(JOBS, f"{name}-trainer"), what="the Job")
    for resource, child, ready in (
        (DEPLOYMENTS, f"{name}-rollout", 1),
        (STATEFULSETS, f"{name}-learner", 1),
        (DEPLOYMENTS, f"{name}-env", 2),
    ):
        await cluster.emulator.set_status(resource, NAMESPACE, child, {"readyReplicas": ready})
    await cluster.emulator.set_status(
        JOBS, NAMESPACE, f"{name}-trainer", {"active": 1, "ready": 1, "startTime": ENDED}
    )
    await cluster.wait_condition(name, "Ready", status="True")


async def _trainer_fails(cluster: Cluster, name: str) -> None:
    """The kubelet records the trainer's crash (its log's end as the termination message, as
    FallbackToLogsOnError does), then the Job controller gives up."""
    log_tail = f"Traceback (most recent call last):\n  File 'loop.py', line 7\n{LAST_LINE}\n"
    await cluster.emulator.put_object(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-trainer-x1",
                "namespace": NAMESPACE,
                "labels": {"aflowrl.io/run": name, "app.kubernetes.io/component": "trainer"},
            },
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "name": "trainer",
                        "state": {
                            "terminated": {
                                "exitCode": 1,
                                "reason": "Error",
                                "message": log_tail,
                                "finishedAt": "2026-01-01T00:59:00Z",
                            }
                        },
                    }
                ],
            },
        },
    )
    failed = {
        "type": "Failed",
        "status": "True",
        "reason": "BackoffLimitExceeded",
        "message": "Job has reached the specified backoff limit",
        "lastTransitionTime": ENDED,
    }
    await cluster.emulator.set_status(
        JOBS, NAMESPACE, f"{name}-trainer", {"failed": 1, "conditions": [failed]}
    )


def _events(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in cluster.emulator.all("v1/events", NAMESPACE)
        if (e.get("involvedObject") or {}).get("name") == name
    ]


async def test_a_run_is_deleted_while_the_operator_is_stopped(cluster: Cluster):
    await cluster.create_run("demo", TINY)
    await cluster.eventually(lambda: cluster.child(JOBS, "demo-trainer"), what="the Job")
    await cluster.settle()  # child events and resyncs have run passes: no finalizer came
    assert not cluster.run("demo")["metadata"].get("finalizers")

    await cluster.stop_operator()  # scaled down, or uninstalled
    async with cluster.server.client.delete(_path(RUNS, "demo")) as response:  # kubectl delete
        assert response.status == 200, await response.text()
    # Gone at once, nothing waits for the operator; the children go by their owner reference.
    assert cluster.emulator.read(RUNS, NAMESPACE, "demo") is None
    for resource, child in ((DEPLOYMENTS, "demo-rollout"), (JOBS, "demo-trainer")):
        assert cluster.child(resource, child) is None


async def test_the_finalizer_of_an_earlier_release_is_removed(cluster: Cluster):
    """Runs created under a release with a resync timer carry kopf's finalizer: the first pass
    of this release lets go of it, so deleting them no longer needs the operator either."""
    body = {
        "apiVersion": "aflowrl.io/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "old", "namespace": NAMESPACE, "finalizers": ["aflowrl.io/operator"]},
        "spec": copy.deepcopy(TINY),
    }
    path = f"/apis/aflowrl.io/v1alpha1/namespaces/{NAMESPACE}/trainingruns"
    async with cluster.server.client.post(path, json=body) as response:
        assert response.status == 200, await response.text()
    await cluster.eventually(
        lambda: not cluster.run("old")["metadata"].get("finalizers"), what="the finalizer gone"
    )


async def test_a_failed_trainer_leaves_an_event_its_last_log_lines_and_kept_pods(cluster: Cluster):
    kept = {**TINY, "trainer": {"keepPodsAfterEnd": True}}
    expired = {**TINY, "trainer": {"keepPodsAfterEnd": True, "ttlSecondsAfterFinished": 3600}}
    for name, spec in (("kept", kept), ("gone", TINY), ("expired", expired)):
        await cluster.create_run(name, spec)
        await _running(cluster, name)
        await _trainer_fails(cluster, name)
    for name in ("kept", "gone", "expired"):
        failed = await cluster.wait_condition(name, "Failed", status="True")
        assert failed["reason"] == "TrainerFailed"

    error = await cluster.eventually(
        lambda: cluster.run("kept")["status"].get("lastError"), what="lastError"
    )
    assert error["component"] == "trainer" and error["pod"] == "kept-trainer-x1"
    assert (error["container"], error["reason"], error["exitCode"]) == ("trainer", "Error", 1)
    assert error["message"].rstrip().endswith(LAST_LINE)

    def warnings(reason: str) -> list[dict[str, Any]]:
        events = _events(cluster, "kept")
        return [e for e in events if (e["type"], e["reason"]) == ("Warning", reason)]

    await cluster.eventually(
        lambda: warnings("TrainerFailed") and warnings("ComponentFailed"),
        what="the failure's Warning events",
    )
    assert any(LAST_LINE in e["message"] for e in warnings("ComponentFailed"))
    assert any("backoff limit" in e["message"] for e in warnings("TrainerFailed"))
    assert all(e["involvedObject"]["kind"] == "TrainingRun" for e in warnings("TrainerFailed"))

    # Without the keep option (or once its TTL has run out) the services go to zero...
    for name in ("gone", "expired"):
        await cluster.eventually(
            lambda n=name: cluster.child(DEPLOYMENTS, f"{n}-rollout")["spec"]["replicas"] == 0,
            what=f"{name} scaled to zero",
        )
    # ...with it they stay, for kubectl logs and exec.
    await cluster.settle()
    assert cluster.child(DEPLOYMENTS, "kept-rollout")["spec"]["replicas"] == 1
    assert cluster.child(STATEFULSETS, "kept-learner")["spec"]["replicas"] == 1
    assert cluster.child(DEPLOYMENTS, "kept-env")["spec"]["replicas"] == 2
    assert "kept" in cluster.condition("kept", "RolloutReady")["message"]
    # The trainer's failed pods are kept by its Job, every container says why it died.
    job = cluster.child(JOBS, "kept-trainer")
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert job["spec"]["backoffLimit"] > 0
    workloads = [
        cluster.child(DEPLOYMENTS, "kept-rollout"),
        cluster.child(STATEFULSETS, "kept-learner"),
        cluster.child(DEPLOYMENTS, "kept-env"),
        job,
    ]
    for workload in workloads:
        for container in workload["spec"]["template"]["spec"]["containers"]:
            assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


async def test_a_hand_edit_is_taken_back_on_the_next_pass_while_the_hpa_count_stays(
    cluster: Cluster,
):
    await cluster.create_run("demo", {**TINY, "trainer": {"activeDeadlineSeconds": 86400}})
    await cluster.eventually(
        lambda: (
            (cluster.run("demo").get("status") or {}).get("observedGeneration") == 1
            and cluster.child(JOBS, "demo-trainer")
            and cluster.child(DEPLOYMENTS, "demo-env")
            and cluster.child(DEPLOYMENTS, "demo-rollout")
        ),
        what="the first pass",
    )
    rollout = cluster.child(DEPLOYMENTS, "demo-rollout")
    image = rollout["spec"]["template"]["spec"]["containers"][0]["image"]
    containers = [dict(rollout["spec"]["template"]["spec"]["containers"][0], image="evil:1")]

    # The autoscaler scales the environment; someone edits the rollout and the trainer Job.
    await _merge_patch(
        cluster, DEPLOYMENTS, "demo-env", {"spec": {"replicas": 3}}, "horizontal-pod-autoscaler"
    )
    await _merge_patch(
        cluster,
        DEPLOYMENTS,
        "demo-rollout",
        {"spec": {"template": {"spec": {"containers": containers}}}},
        "kubectl-edit",
    )
    await _merge_patch(
        cluster, JOBS, "demo-trainer", {"spec": {"activeDeadlineSeconds": 60}}, "kubectl-edit"
    )

    # No spec change: the next pass takes the operator's fields back...
    await cluster.eventually(
        lambda: (
            cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["template"]["spec"]["containers"][0][
                "image"
            ]
            == image
        ),
        what="the image taken back",
    )
    await cluster.eventually(
        lambda: cluster.child(JOBS, "demo-trainer")["spec"]["activeDeadlineSeconds"] == 86400,
        what="the Job's deadline taken back",
    )
    # ...and leaves the autoscaler's count alone.
    await cluster.settle()
    assert cluster.run("demo")["metadata"]["generation"] == 1
    assert cluster.child(DEPLOYMENTS, "demo-env")["spec"]["replicas"] == 3
    env_owners = cluster.emulator.managers(DEPLOYMENTS, NAMESPACE, "demo-env")
    assert ("spec", "replicas") in env_owners["horizontal-pod-autoscaler"]
    assert ("spec", "replicas") not in env_owners["aflowrl-operator"]
    rollout_owners = cluster.emulator.managers(DEPLOYMENTS, NAMESPACE, "demo-rollout")
    assert ("spec", "template", "spec", "containers") in rollout_owners["aflowrl-operator"]
    job_owners = cluster.emulator.managers(JOBS, NAMESPACE, "demo-trainer")
    assert ("spec", "activeDeadlineSeconds") in job_owners["aflowrl-operator"]
    # The trainer Job is applied like every child: never POSTed.
    assert cluster.emulator.count_writes("POST", "jobs") == 0
    # The operator wrote the run's status through the status subresource only.
    operator = cluster.emulator.operator_requests()
    assert ("patch", "aflowrl.io", "trainingruns/status") in operator


async def test_the_operator_counts_and_times_each_handler(cluster: Cluster):
    await cluster.create_run("demo", TINY)
    await cluster.eventually(lambda: cluster.child(JOBS, "demo-trainer"), what="the Job")
    await cluster.emulator.set_status(DEPLOYMENTS, NAMESPACE, "demo-rollout", {"readyReplicas": 1})
    registry = cluster.config.metrics.registry

    def calls(handler: str) -> float:
        return sum(
            registry.get_sample_value(
                "aflowrl_operator_handler_calls_total", {"handler": handler, "result": result}
            )
            or 0.0
            for result in ("ok", "coalesced")
        )

    for handler in ("reconcile", "child", "resync"):  # creation, a child's event, the timer
        await cluster.eventually(lambda h=handler: calls(h) > 0, what=f"{handler} calls")
        timed = registry.get_sample_value(
            "aflowrl_operator_handler_duration_seconds_count", {"handler": handler}
        )
        assert timed is not None and timed > 0
    assert registry.get_sample_value("process_cpu_seconds_total") is not None
