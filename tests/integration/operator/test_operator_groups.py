"""Replicas larger than a node, with the real operator against the emulated API server.

The emulator serves the LeaderWorkerSet API (or not) but runs no LWS controller: tests play it
by writing the LeaderWorkerSets' status (ready groups), as the other emulator tests play the
deployment controller.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import AsyncIterator

import kubernetes_validate
import pytest
from kube_emulator import COSCHEDULING, GROUPS, KUEUE, MONITORING, PEERING, RESOURCES
from operator_harness import (
    DEPLOYMENTS,
    JOBS,
    NAMESPACE,
    PODS,
    SERVICES,
    STATEFULSETS,
    Cluster,
    chart_denies,
    emulated_cluster,
)

import leaderworkerset

pytestmark = pytest.mark.timeout(90)

K8S_VERSION = "1.30.0"
LWS = "leaderworkerset.x-k8s.io/v1/leaderworkersets"

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


def _unnumbered(lwt: dict) -> dict:
    """A replica's ``leaderWorkerTemplate`` without its replica label and template hash."""
    lwt = copy.deepcopy(lwt)
    for role in ("leaderTemplate", "workerTemplate"):
        meta = lwt[role]["metadata"]
        assert meta["labels"].pop("aflowrl.io/replica") is not None
        assert meta["annotations"].pop("aflowrl.io/template-hash") is not None
    return lwt


def _env(container: dict) -> dict:
    return {e["name"]: e.get("value") for e in container["env"]}


async def test_every_multi_node_replica_is_a_leader_worker_set_of_its_own(lws_cluster: Cluster):
    cluster = lws_cluster
    run = await cluster.create_run("demo", MULTI, labels={"kueue.x-k8s.io/queue-name": "gpu"})
    uid = run["metadata"]["uid"]
    replicas = [
        await cluster.eventually(
            lambda name=name: cluster.child(LWS, name), what=f"the LeaderWorkerSet {name}"
        )
        for name in ("demo-rollout-0", "demo-rollout-1")
    ]
    learner = await cluster.eventually(lambda: cluster.child(LWS, "demo-learner"))
    executor = await cluster.eventually(lambda: cluster.child(LWS, "demo-executor-0"))
    # One object per replica, no more: two rollout replicas, one executor replica, the learner.
    assert sorted(o["metadata"]["name"] for o in cluster.emulator.all(LWS, NAMESPACE)) == [
        "demo-executor-0",
        "demo-learner",
        "demo-rollout-0",
        "demo-rollout-1",
    ]
    for group in (*replicas, learner, executor):
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
            assert "kueue.x-k8s.io/queue-name" not in labels  # Kueue sees the run's Workload
        # Kueue holds the run: every group at zero until the Workload is admitted.
        assert group["spec"]["replicas"] == 0
    for index, group in enumerate((*replicas, executor)):
        labels = group["metadata"]["labels"]
        assert labels["aflowrl.io/replica"] == str(index % 2)
        lwt = group["spec"]["leaderWorkerTemplate"]
        for template in (lwt["leaderTemplate"], lwt["workerTemplate"]):
            assert template["metadata"]["labels"]["aflowrl.io/replica"] == str(index % 2)
    # The replicas differ only in their index and the template hash that follows from it.
    first, second = (_unnumbered(r["spec"]["leaderWorkerTemplate"]) for r in replicas)
    assert first == second
    assert first["leaderTemplate"] != first["workerTemplate"]  # the comparison compares
    workload = await cluster.eventually(
        lambda: cluster.child("kueue.x-k8s.io/v1beta2/workloads", "demo-kueue")
    )
    # One Workload for the run: a pod set per component, every pod of every group in it.
    counts = {ps["name"]: ps["count"] for ps in workload["spec"]["podSets"]}
    assert counts == {"executor": 2, "rollout": 4, "learner": 2, "environment": 4, "trainer": 1}
    group = await cluster.eventually(
        lambda: cluster.child("scheduling.x-k8s.io/v1alpha1/podgroups", "demo-gpu")
    )
    assert group["spec"]["minMember"] == 4 + 2 + 2  # every pod of every group

    # Admitted on a flavor: each replica runs its one group, every pod of it placed there.
    await cluster.emulator.put_object(
        "kueue.x-k8s.io/v1beta2/resourceflavors",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "h100"},
            "spec": {"nodeLabels": {"pool": "h100"}},
        },
    )
    await cluster.emulator.set_status(
        "kueue.x-k8s.io/v1beta2/workloads",
        NAMESPACE,
        "demo-kueue",
        {
            "admission": {
                "clusterQueue": "gpu",
                "podSetAssignments": [
                    {"name": name, "flavors": {"nvidia.com/gpu": "h100"}, "count": count}
                    for name, count in counts.items()
                ],
            },
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                {"type": "Admitted", "status": "True", "reason": "Admitted"},
            ],
        },
    )
    for name in ("demo-rollout-0", "demo-rollout-1", "demo-executor-0", "demo-learner"):
        group = await cluster.eventually(
            lambda name=name: (g := cluster.child(LWS, name))["spec"]["replicas"] == 1 and g,
            what=f"{name} to run one group",
        )
        lwt = group["spec"]["leaderWorkerTemplate"]
        for template in (lwt["leaderTemplate"], lwt["workerTemplate"]):
            assert template["spec"]["nodeSelector"]["pool"] == "h100"
    rollout = cluster.child(LWS, "demo-rollout-0")
    executor = cluster.child(LWS, "demo-executor-0")
    learner = cluster.child(LWS, "demo-learner")

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


async def test_replica_groups_restart_scale_suspend_and_go_back_to_deployments(
    lws_cluster: Cluster,
):
    cluster = lws_cluster
    spec = {k: v for k, v in MULTI.items() if k != "scheduling"}
    run = await cluster.create_run("demo", spec)
    # Another's LeaderWorkerSet carrying the run's labels, and a group left by an operator
    # before per-replica groups (owned by the run): the first is never touched, the second
    # goes.
    labels = {"aflowrl.io/run": "demo", "app.kubernetes.io/component": "rollout"}
    owner = {
        "apiVersion": "aflowrl.io/v1alpha1",
        "kind": "TrainingRun",
        "name": "demo",
        "uid": run["metadata"]["uid"],
        "controller": True,
    }
    for name, refs in (("demo-rollout-7", []), ("demo-rollout-group", [owner])):
        await cluster.emulator.put_object(
            LWS,
            {
                "apiVersion": "leaderworkerset.x-k8s.io/v1",
                "kind": "LeaderWorkerSet",
                "metadata": {
                    "name": name,
                    "namespace": NAMESPACE,
                    "labels": labels,
                    "ownerReferences": refs,
                },
                "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2}},
            },
        )
    for name in ("demo-rollout-0", "demo-rollout-1", "demo-executor-0"):
        await cluster.eventually(
            lambda name=name: (cluster.child(LWS, name) or {}).get("spec", {}).get("replicas") == 1,
            what=f"{name} running one group",
        )
    await cluster.eventually(lambda: cluster.child(LWS, "demo-learner")["spec"]["replicas"] == 1)
    await cluster.eventually(lambda: cluster.child(JOBS, "demo-trainer"), what="the Job")
    await cluster.eventually(
        lambda: cluster.child(LWS, "demo-rollout-group") is None, what="the old group's removal"
    )
    for name in ("demo-rollout-0", "demo-rollout-1", "demo-executor-0", "demo-learner"):
        await cluster.emulator.set_status(LWS, NAMESPACE, name, {"readyReplicas": 1})
    await cluster.emulator.set_status(DEPLOYMENTS, NAMESPACE, "demo-env", {"readyReplicas": 2})
    await cluster.emulator.set_status(
        JOBS,
        NAMESPACE,
        "demo-trainer",
        {"active": 1, "ready": 1, "startTime": "2026-01-01T00:00:00Z"},
    )
    ready = await cluster.wait_condition("demo", "RolloutReady", status="True")
    assert ready["message"].startswith("2/2 ")  # the replicas of both objects, counted together
    await cluster.wait_condition("demo", "LearnerReady", status="True")
    await cluster.wait_condition("demo", "Ready", status="True")

    # One pod of replica 1's group fails: the LWS controller recreates that group, which is
    # not ready until every pod of it is back; replica 0 is untouched.
    await cluster.emulator.set_status(LWS, NAMESPACE, "demo-rollout-1", {"readyReplicas": 0})
    degraded = await cluster.wait_condition("demo", "Degraded", status="True")
    assert degraded["reason"] == "ReplicasUnavailable"
    rollout_ready = cluster.condition("demo", "RolloutReady")
    assert rollout_ready["status"] == "False" and "1/2" in rollout_ready["message"]
    await cluster.emulator.set_status(LWS, NAMESPACE, "demo-rollout-1", {"readyReplicas": 1})
    await cluster.wait_condition("demo", "Degraded", status="False")
    replica_0 = cluster.emulator.versions(LWS, NAMESPACE, "demo-rollout-0")

    # Scaling up adds replicas of their own; scaling down deletes the run's surplus only.
    await cluster.patch_spec("demo", {"rollout": {"replicas": 3}})
    added = await cluster.eventually(
        lambda: cluster.child(LWS, "demo-rollout-2"), what="a third replica"
    )
    assert added["spec"]["replicas"] == 1
    assert added["metadata"]["labels"]["aflowrl.io/replica"] == "2"
    leaderworkerset.validate(added, K8S_VERSION)
    await cluster.patch_spec("demo", {"rollout": {"replicas": 1}})
    await cluster.eventually(
        lambda: (
            cluster.child(LWS, "demo-rollout-1") is None
            and cluster.child(LWS, "demo-rollout-2") is None
        ),
        what="the surplus replicas' removal",
    )
    assert cluster.child(LWS, "demo-rollout-0")["spec"]["replicas"] == 1
    # Replica counts are not in the pods' spec hash: replica 0 was never rewritten.
    assert cluster.emulator.versions(LWS, NAMESPACE, "demo-rollout-0") == replica_0
    assert cluster.child(LWS, "demo-rollout-7") is not None  # not the run's

    # Suspending scales every group to zero; one node per replica turns the groups back into
    # a Deployment.
    await cluster.patch_spec("demo", {"suspend": True})
    await cluster.eventually(
        lambda: cluster.child(LWS, "demo-learner")["spec"]["replicas"] == 0, what="suspension"
    )
    for name in ("demo-rollout-0", "demo-executor-0"):
        await cluster.eventually(
            lambda name=name: cluster.child(LWS, name)["spec"]["replicas"] == 0,
            what=f"{name} at zero",
        )
    await cluster.patch_spec(
        "demo",
        {
            "suspend": False,
            "rollout": {
                "replicas": 2,
                "nodesPerReplica": 1,
                "resources": {**GPU8},
                "vllm": {"pipelineParallelSize": 1},
            },
        },
    )
    await cluster.eventually(
        lambda: cluster.child(LWS, "demo-rollout-0") is None, what="the groups' removal"
    )
    deployment = await cluster.eventually(lambda: cluster.child(DEPLOYMENTS, "demo-rollout"))
    assert deployment["spec"]["replicas"] == 2
    service = cluster.child(SERVICES, "demo-rollout")
    assert "leaderworkerset.sigs.k8s.io/worker-index" not in service["spec"]["selector"]
    assert cluster.child(LWS, "demo-executor-0") is not None  # still two nodes per replica
    assert cluster.child(LWS, "demo-rollout-7") is not None

    # The chart's least-privilege RBAC grants what the groups took.
    made = cluster.emulator.operator_requests()
    assert {
        ("get", "leaderworkerset.x-k8s.io", "leaderworkersets"),
        ("list", "leaderworkerset.x-k8s.io", "leaderworkersets"),  # the surplus, by label
        ("watch", "leaderworkerset.x-k8s.io", "leaderworkersets"),  # their ready groups
        ("patch", "leaderworkerset.x-k8s.io", "leaderworkersets"),  # server-side apply
        ("delete", "leaderworkerset.x-k8s.io", "leaderworkersets"),
    } <= made
    assert chart_denies(made) == []


HASH = "aflowrl.io/template-hash"


async def _run_group(cluster: Cluster, name: str) -> list[str]:
    """Play the LWS controller: the pods of the group of LeaderWorkerSet ``name`` as its
    template is now, all ready; returns their names."""
    group = cluster.child(LWS, name)
    lwt = group["spec"]["leaderWorkerTemplate"]
    names = []
    for index in range(lwt["size"]):
        template = lwt["leaderTemplate" if index == 0 else "workerTemplate"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-0" + (f"-{index}" if index else ""),
                "namespace": NAMESPACE,
                "labels": {
                    **template["metadata"]["labels"],
                    "leaderworkerset.sigs.k8s.io/worker-index": str(index),
                },
                "annotations": template["metadata"]["annotations"],
            },
            "spec": template["spec"],
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }
        await cluster.emulator.put_object(PODS, pod)
        names.append(pod["metadata"]["name"])
    return names


async def test_a_new_template_reaches_the_replica_groups_one_at_a_time(lws_cluster: Cluster):
    cluster = lws_cluster
    await cluster.create_run("demo", {k: v for k, v in MULTI.items() if k != "scheduling"})
    replicas = ("demo-rollout-0", "demo-rollout-1")
    for name in replicas:
        await cluster.eventually(
            lambda name=name: (cluster.child(LWS, name) or {}).get("spec", {}).get("replicas"),
            what=f"{name} running",
        )
    pods = {name: await _run_group(cluster, name) for name in replicas}
    old = {name: cluster.child(LWS, name)["metadata"]["annotations"][HASH] for name in replicas}

    def updated() -> list[str]:
        return [
            name
            for name in replicas
            if cluster.child(LWS, name)["metadata"]["annotations"][HASH] != old[name]
        ]

    await cluster.patch_spec("demo", {"rollout": {"pod": {"annotations": {"team": "rl"}}}})
    first = (await cluster.eventually(updated, what="one replica's new template"))[0]
    other = next(name for name in replicas if name != first)
    lwt = cluster.child(LWS, first)["spec"]["leaderWorkerTemplate"]
    assert lwt["leaderTemplate"]["metadata"]["annotations"]["team"] == "rl"
    # While that replica's group is recreated, the other keeps serving the old template.
    for pod in pods[first]:
        await cluster.emulator.delete_object(PODS, NAMESPACE, pod)
    await cluster.settle()
    assert updated() == [first]
    assert (
        "team"
        not in (
            cluster.child(LWS, other)["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"][
                "annotations"
            ]
        )
    )
    # Its group is back on the new template: the other replica's turn.
    await _run_group(cluster, first)
    await cluster.eventually(lambda: len(updated()) == 2, what="the second replica's turn")


async def test_a_leader_worker_set_status_change_alone_updates_the_run(lws_cluster: Cluster):
    cluster = lws_cluster
    # No resync within the test: only an event can run a pass.
    await cluster.stop_operator()
    cluster.operator.config = dataclasses.replace(cluster.config, resync_interval_s=3600.0)
    await cluster.start_operator()
    await cluster.create_run("demo", {k: v for k, v in MULTI.items() if k != "scheduling"})
    for name in ("demo-rollout-0", "demo-rollout-1"):
        await cluster.eventually(
            lambda name=name: (cluster.child(LWS, name) or {}).get("spec", {}).get("replicas"),
            what=f"{name} running",
        )
    waiting = await cluster.wait_condition("demo", "RolloutReady", status="False")
    assert waiting["message"].startswith("0/2 ")
    await _quiet(cluster)
    # The LWS controller marks both groups ready; no pod, no other object changes.
    for name in ("demo-rollout-0", "demo-rollout-1"):
        await cluster.emulator.set_status(LWS, NAMESPACE, name, {"readyReplicas": 1})
    # Promptly: well before the resync, and before kopf's watches of other kinds restart (which
    # list their objects again, about a minute in here, and would run a pass too).
    ready = await cluster.eventually(
        lambda: (cluster.condition("demo", "RolloutReady") or {}).get("status") == "True",
        within=30.0,
        what="RolloutReady after the groups' status alone",
    )
    assert ready and cluster.condition("demo", "RolloutReady")["message"].startswith("2/2 ")


async def test_a_run_whose_status_is_refused_is_told_once_and_still_reconciled(
    lws_cluster: Cluster,
):
    cluster = lws_cluster
    await cluster.create_run("demo", {k: v for k, v in MULTI.items() if k != "scheduling"})
    await cluster.wait_condition("demo", "RolloutReady", status="False")
    # As the API server answers every write of a run that breaks a root rule of the CRD added
    # after it was created (they run on status writes too): 422.
    cluster.emulator.fail_next("PATCH", "trainingruns", 422, times=10_000)
    for name in ("demo-rollout-0", "demo-rollout-1"):
        await cluster.emulator.set_status(LWS, NAMESPACE, name, {"readyReplicas": 1})

    def refusals() -> list[dict]:
        return [
            e
            for e in cluster.emulator.all("v1/events", NAMESPACE)
            if e.get("reason") == "StatusRejected"
        ]

    told = await cluster.eventually(refusals, what="a StatusRejected event")
    assert told[0]["type"] == "Warning" and "HTTP 422" in told[0]["message"]
    await cluster.settle(passes=5)  # the operator goes on, and says it once
    assert len(refusals()) == 1
    assert cluster.condition("demo", "RolloutReady")["status"] == "False"
    # Children are still applied: a third replica appears.
    await cluster.patch_spec("demo", {"rollout": {"replicas": 3}})
    await cluster.eventually(lambda: cluster.child(LWS, "demo-rollout-2"), what="a third replica")
    # The run fixed (here: the API server accepts it again), its status follows.
    cluster.emulator.clear_failures()
    await cluster.emulator.set_status(LWS, NAMESPACE, "demo-rollout-2", {"readyReplicas": 1})
    await cluster.wait_condition("demo", "RolloutReady", status="True")


async def _quiet(cluster: Cluster) -> None:
    """Wait until the operator has made no pass for a while (so that a pass that follows is
    one an event caused)."""
    while True:
        before = cluster.passes()
        await asyncio.sleep(2.0)
        if cluster.passes() == before:
            return


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
    assert cluster.emulator.all(LWS, NAMESPACE) == []
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
