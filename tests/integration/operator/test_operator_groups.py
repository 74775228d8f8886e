"""Replicas larger than a node, with the real operator against the emulated API server.

The emulator serves the LeaderWorkerSet API (or not) but runs no LWS controller: tests play it
by writing the LeaderWorkerSets' status (ready groups), as the other emulator tests play the
deployment controller.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import kubernetes_validate
import pytest
from kube_emulator import COSCHEDULING, GROUPS, KUEUE, MONITORING, PEERING, RESOURCES
from operator_harness import NAMESPACE, Cluster, chart_denies, emulated_cluster

import leaderworkerset

pytestmark = pytest.mark.timeout(90)

K8S_VERSION = "1.30.0"
LWS = "leaderworkerset.x-k8s.io/v1/leaderworkersets"
DEPLOYMENTS = "apps/v1/deployments"
STATEFULSETS = "apps/v1/statefulsets"
SERVICES = "v1/services"
JOBS = "batch/v1/jobs"

GPU8 = {"cpu": "32", "memory": "512Gi", "gpus": 8, "rdma": 1}
MULTI: dict = {
    "policy": {"model": "/models/policy-70b", "persistentVolumeClaim": "models"},
    "rollout": {
        "engine": "vllm",
        "replicas": 2,
        "nodesPerReplica": 2,
        "resources": GPU8,
        "vllm": {"tensorParallelSize": 8, "pipelineParallelSize": 2},
    },
    "learner": {"nodes": 2, "procsPerNode": 8, "resources": GPU8},
    "environment": {
        "replicas": {"min": 2, "max": 4},
        "executor": {
            "type": "openai",
            "model": "llama-70b",
            "serve": {
                "model": "/models/llama-70b",
                "persistentVolumeClaim": "models",
                "nodesPerReplica": 2,
                "pipelineParallelSize": 2,
                "distributedBackend": "ray",
                "resources": {"cpu": "32", "memory": "512Gi", "gpus": 8},
            },
        },
    },
    "weightTransport": {"type": "filesystem"},
    "storage": {"size": "1Ti", "accessMode": "ReadWriteMany"},
    "scheduling": {"gang": {}},
}


@pytest.fixture()
async def lws_cluster() -> AsyncIterator[Cluster]:
    """An emulated cluster serving the LeaderWorkerSet API, and a running operator."""
    tables = (RESOURCES, MONITORING, KUEUE, COSCHEDULING, PEERING, GROUPS)
    async with emulated_cluster(*tables) as harness:
        yield harness


@pytest.fixture()
async def plain_cluster() -> AsyncIterator[Cluster]:
    """An emulated cluster without the LeaderWorkerSet API, and a running operator."""
    async with emulated_cluster(RESOURCES, MONITORING, KUEUE, COSCHEDULING, PEERING) as harness:
        yield harness


def _env(container: dict) -> dict:
    return {e["name"]: e.get("value") for e in container["env"]}


async def test_a_multi_node_replica_is_a_leader_worker_set_group(lws_cluster: Cluster):
    cluster = lws_cluster
    run = await cluster.create_run("demo", MULTI, labels={"kueue.x-k8s.io/queue-name": "gpu"})
    uid = run["metadata"]["uid"]
    rollout = await cluster.eventually(
        lambda: cluster.child(LWS, "demo-rollout-group"), what="the rollout LeaderWorkerSet"
    )
    learner = await cluster.eventually(lambda: cluster.child(LWS, "demo-learner"))
    executor = await cluster.eventually(lambda: cluster.child(LWS, "demo-executor-group"))
    for group in (rollout, learner, executor):
        ref = group["metadata"]["ownerReferences"][0]
        assert (ref["kind"], ref["uid"], ref["controller"]) == ("TrainingRun", uid, True)
        leaderworkerset.validate(group, K8S_VERSION)
        lwt = group["spec"]["leaderWorkerTemplate"]
        assert lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
        assert lwt["size"] == 2
        for template in (lwt["leaderTemplate"], lwt["workerTemplate"]):
            labels = template["metadata"]["labels"]
            assert labels["aflowrl.io/run"] == "demo"
            assert labels["scheduling.x-k8s.io/pod-group"] == "demo-gpu"  # the gang
            assert template["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    # Kueue holds the run: every group at zero until the Workload is admitted.
    assert rollout["spec"]["replicas"] == 0 and learner["spec"]["replicas"] == 0
    workload = await cluster.eventually(
        lambda: cluster.child("kueue.x-k8s.io/v1beta2/workloads", "demo-kueue")
    )
    counts = {ps["name"]: ps["count"] for ps in workload["spec"]["podSets"]}
    assert counts == {"executor": 2, "rollout": 4, "learner": 2, "environment": 4, "trainer": 1}
    group = await cluster.eventually(
        lambda: cluster.child("scheduling.x-k8s.io/v1alpha1/podgroups", "demo-gpu")
    )
    assert group["spec"]["minMember"] == 4 + 2 + 2  # every pod of every group

    # No Deployment or StatefulSet stands in for a group.
    assert cluster.child(DEPLOYMENTS, "demo-rollout") is None
    assert cluster.child(DEPLOYMENTS, "demo-executor") is None
    assert cluster.child(STATEFULSETS, "demo-learner") is None

    # Rollout: the leader serves gRPC, probed; the workers join it headless.
    lwt = rollout["spec"]["leaderWorkerTemplate"]
    leader = lwt["leaderTemplate"]["spec"]["containers"][0]
    worker = lwt["workerTemplate"]["spec"]["containers"][0]
    assert leader["command"][:3] == ["aflowrl", "serve", "rollout"]
    assert worker["command"][:3] == ["aflowrl", "serve", "rollout-worker"]
    assert {p["name"]: p["containerPort"] for p in leader["ports"]} == {
        "grpc": 50052,
        "metrics": 9090,
        "group": 29610,
    }
    assert leader["readinessProbe"]["grpc"]["port"] == 50052
    assert "exec" in worker["readinessProbe"] and "exec" in worker["livenessProbe"]
    for container in (leader, worker):
        env = _env(container)
        assert env["AFLOWRL_GROUP_LEADER"] == "$(LWS_LEADER_ADDRESS)"
        assert env["AFLOWRL_GROUP_RANK"] == "$(LWS_WORKER_INDEX)"
        assert env["AFLOWRL_GROUP_SIZE"] == "$(LWS_GROUP_SIZE)"
        assert env["AFLOWRL_GROUP_PORT"] == "29610"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert container["resources"]["limits"]["rdma/ib"] == "1"
    # The trainer's Service selects the leaders only.
    service = cluster.child(SERVICES, "demo-rollout")
    kubernetes_validate.validate(service, K8S_VERSION, strict=True)
    assert service["spec"]["selector"] == {
        "aflowrl.io/run": "demo",
        "app.kubernetes.io/component": "rollout",
        "leaderworkerset.sigs.k8s.io/worker-index": "0",
    }

    # Executor over Ray: a head on the leader before the server, the workers join it.
    lwt = executor["spec"]["leaderWorkerTemplate"]
    leader = lwt["leaderTemplate"]["spec"]["containers"][0]
    worker = lwt["workerTemplate"]["spec"]["containers"][0]
    assert leader["command"][:2] == ["sh", "-c"]
    assert leader["command"][2].startswith("ray start --head --port 29610")
    assert "--distributed-executor-backend ray" in leader["command"][2]
    assert "--tensor-parallel-size 8 --pipeline-parallel-size 2" in leader["command"][2]
    assert worker["command"] == [
        "ray", "start", "--address", "$(LWS_LEADER_ADDRESS):29610", "--block",
    ]  # fmt: skip
    assert leader["readinessProbe"]["httpGet"]["path"] == "/health"
    service = cluster.child(SERVICES, "demo-executor")
    assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"

    # Learner: one group; rank 0's pod is the rendezvous host and the probed gRPC server.
    lwt = learner["spec"]["leaderWorkerTemplate"]
    leader = lwt["leaderTemplate"]["spec"]["containers"][0]
    worker = lwt["workerTemplate"]["spec"]["containers"][0]
    assert leader["command"] == worker["command"]
    assert f"demo-learner-0.demo-learner.{NAMESPACE}.svc:29500" in leader["command"]
    assert leader["readinessProbe"]["grpc"]["port"] == 50053
    assert "29500" in worker["livenessProbe"]["exec"]["command"][-1]
    service = cluster.child(SERVICES, "demo-learner")
    assert service["spec"]["publishNotReadyAddresses"] is True
    # The run's Service exists before the group, so the LWS controller reuses it (as the
    # pods' subdomain) rather than creating one of that name the run could not own.
    created = [(plural, name) for plural, _, name in cluster.emulator.created]
    assert created.index(("services", "demo-learner")) < created.index(
        ("leaderworkersets", "demo-learner")
    )


async def test_a_group_that_restarts_makes_the_run_degraded_until_it_is_back(
    lws_cluster: Cluster,
):
    cluster = lws_cluster
    spec = {k: v for k, v in MULTI.items() if k != "scheduling"}
    await cluster.create_run("demo", spec)
    await cluster.eventually(
        lambda: (
            (cluster.child(LWS, "demo-rollout-group") or {}).get("spec", {}).get("replicas") == 2
        ),
        what="two rollout groups",
    )
    await cluster.eventually(lambda: cluster.child(LWS, "demo-learner")["spec"]["replicas"] == 1)
    await cluster.eventually(lambda: cluster.child(JOBS, "demo-trainer"), what="the Job")
    for name, ready in (("demo-rollout-group", 2), ("demo-learner", 1)):
        await cluster.emulator.set_status(LWS, NAMESPACE, name, {"readyReplicas": ready})
    await cluster.emulator.set_status(LWS, NAMESPACE, "demo-executor-group", {"readyReplicas": 1})
    await cluster.emulator.set_status(DEPLOYMENTS, NAMESPACE, "demo-env", {"readyReplicas": 2})
    await cluster.emulator.set_status(
        JOBS,
        NAMESPACE,
        "demo-trainer",
        {"active": 1, "ready": 1, "startTime": "2026-01-01T00:00:00Z"},
    )
    await cluster.wait_condition("demo", "RolloutReady", status="True")
    await cluster.wait_condition("demo", "LearnerReady", status="True")
    await cluster.wait_condition("demo", "Ready", status="True")

    # One pod of a rollout group fails: the LWS controller recreates the whole group, which
    # is not ready until every pod of it is back.
    await cluster.emulator.set_status(LWS, NAMESPACE, "demo-rollout-group", {"readyReplicas": 1})
    degraded = await cluster.wait_condition("demo", "Degraded", status="True")
    assert degraded["reason"] == "ReplicasUnavailable"
    assert cluster.condition("demo", "RolloutReady")["status"] == "False"
    await cluster.emulator.set_status(LWS, NAMESPACE, "demo-rollout-group", {"readyReplicas": 2})
    await cluster.wait_condition("demo", "Degraded", status="False")

    # Suspending scales every group to zero; one node per replica turns the group back into
    # a Deployment.
    await cluster.patch_spec("demo", {"suspend": True})
    await cluster.eventually(
        lambda: cluster.child(LWS, "demo-learner")["spec"]["replicas"] == 0, what="suspension"
    )
    assert cluster.child(LWS, "demo-rollout-group")["spec"]["replicas"] == 0
    await cluster.patch_spec(
        "demo",
        {
            "suspend": False,
            "rollout": {
                "nodesPerReplica": 1,
                "resources": {**GPU8},
                "vllm": {"pipelineParallelSize": 1},
            },
        },
    )
    await cluster.eventually(
        lambda: cluster.child(LWS, "demo-rollout-group") is None, what="the group's removal"
    )
    deployment = await cluster.eventually(lambda: cluster.child(DEPLOYMENTS, "demo-rollout"))
    assert deployment["spec"]["replicas"] == 2
    service = cluster.child(SERVICES, "demo-rollout")
    assert "leaderworkerset.sigs.k8s.io/worker-index" not in service["spec"]["selector"]

    # The chart's least-privilege RBAC grants what the groups took.
    made = cluster.emulator.operator_requests()
    assert {
        ("get", "leaderworkerset.x-k8s.io", "leaderworkersets"),
        ("patch", "leaderworkerset.x-k8s.io", "leaderworkersets"),  # server-side apply
        ("delete", "leaderworkerset.x-k8s.io", "leaderworkersets"),
    } <= made
    assert chart_denies(made) == []


async def test_without_the_leader_worker_set_api_the_run_says_so(plain_cluster: Cluster):
    cluster = plain_cluster
    spec = {k: v for k, v in MULTI.items() if k != "scheduling"}
    await cluster.create_run("demo", spec)
    degraded = await cluster.wait_condition("demo", "Degraded", reason="MultiNodeUnavailable")
    assert degraded["status"] == "True"
    assert "rollout (nodesPerReplica=2)" in degraded["message"]
    assert "executor (nodesPerReplica=2)" in degraded["message"]
    assert "kubernetes-sigs/lws" in degraded["message"]
    assert cluster.condition("demo", "RolloutReady")["status"] == "False"
    # Nothing half-built stands in for the groups; the learner falls back to its StatefulSet.
    assert cluster.child(DEPLOYMENTS, "demo-rollout") is None
    assert cluster.child(DEPLOYMENTS, "demo-executor") is None
    assert cluster.child(STATEFULSETS, "demo-learner") is not None
    assert cluster.emulator.read(LWS, NAMESPACE, "demo-rollout-group") is None
    # Back to one node per replica: the run is no longer degraded by it.
    await cluster.patch_spec(
        "demo",
        {
            "rollout": {"nodesPerReplica": 1, "vllm": {"pipelineParallelSize": 1}},
            "environment": {"executor": {"serve": {"nodesPerReplica": 1}}},
        },
    )
    await cluster.eventually(lambda: cluster.child(DEPLOYMENTS, "demo-rollout"), what="rollout")
    await cluster.eventually(
        lambda: cluster.condition("demo", "Degraded")["reason"] != "MultiNodeUnavailable",
        what="MultiNodeUnavailable to clear",
    )
