"""The real operator (kopf, in-process) against an emulated Kubernetes API (kmock).

The emulator has no controllers: tests play the deployment controller, the kubelet and the
trainer by writing children's statuses, and kmock's gaps (generation, owner-reference garbage
collection, the status subresource) are filled by ``kube_emulator.KubeEmulator``.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kube_emulator import (
    COSCHEDULING,
    GROUPS,
    KUEUE,
    MONITORING,
    PEERING,
    RESOURCES,
    KubeEmulator,
)
from operator_harness import (
    DEPLOYMENTS,
    JOBS,
    NAMESPACE,
    PODS,
    RESYNC_S,
    RUNS,
    SERVICES,
    STATEFULSETS,
    TINY,
    Cluster,
    chart_denies,
)

from aflowrl.common.run_status import RunStatusReporter
from aflowrl.config import CONDITION_TYPES, ImageDefaults, RunSpec
from aflowrl_operator.validation import with_default_images

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "charts"))

pytestmark = pytest.mark.timeout(90)

K8S_VERSION = "1.30.0"

HPAS = "autoscaling/v2/horizontalpodautoscalers"


FULL: dict = {
    "policy": {"model": "/models/Qwen2.5-7B-Instruct", "persistentVolumeClaim": "models"},
    "rollout": {
        "engine": "vllm",
        "replicas": 2,
        "resources": {"cpu": "8", "memory": "64Gi", "gpus": 2},
        "vllm": {"tensorParallelSize": 2},
    },
    "learner": {
        "nodes": 2,
        "procsPerNode": 4,
        "resources": {"cpu": "16", "memory": "128Gi", "gpus": 4},
    },
    "environment": {
        "benchmarks": ["gsm8k"],
        "data": {"dir": "/data", "persistentVolumeClaim": "datasets"},
        "executor": {
            "type": "openai",
            "model": "qwen-executor",
            "serve": {
                "model": "/models/Qwen2.5-7B-Instruct",
                "persistentVolumeClaim": "models",
                "resources": {"cpu": "4", "memory": "32Gi", "gpus": 1},
            },
        },
        "replicas": {"min": 2, "max": 6},
        "podDisruptionBudget": {"maxUnavailable": 1},
    },
    "weightTransport": {"type": "filesystem"},
    "storage": {"size": "100Gi", "accessMode": "ReadWriteMany"},
    "monitoring": {"serviceMonitor": {"enabled": True, "additionalLabels": {"release": "prom"}}},
    "grpc": {"authTokenSecret": {"name": "grpc-token", "key": "token"}, "tlsSecret": "grpc-tls"},
    "scheduling": {
        "nodeSelector": {"gpu": "h100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "training",
    },
    "images": {"pullSecrets": ["regcred"]},
}

CHILDREN = [
    ("v1/configmaps", "demo-spec"),
    ("v1/serviceaccounts", "demo-trainer"),
    ("rbac.authorization.k8s.io/v1/roles", "demo-trainer"),
    ("rbac.authorization.k8s.io/v1/rolebindings", "demo-trainer"),
    ("v1/persistentvolumeclaims", "demo-checkpoints"),
    (DEPLOYMENTS, "demo-executor"),
    (SERVICES, "demo-executor"),
    (DEPLOYMENTS, "demo-rollout"),
    (SERVICES, "demo-rollout"),
    (STATEFULSETS, "demo-learner"),
    (SERVICES, "demo-learner"),
    (DEPLOYMENTS, "demo-env"),
    (SERVICES, "demo-env"),
    (HPAS, "demo-env"),
    ("networking.k8s.io/v1/networkpolicies", "demo-env-egress"),
    ("policy/v1/poddisruptionbudgets", "demo-env"),
    (JOBS, "demo-trainer"),
    ("monitoring.coreos.com/v1/podmonitors", "demo"),
]


def _container(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]["containers"][0]


def _env(obj: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in _container(obj)["env"]}


async def _children_ready(cluster: Cluster, name: str = "demo", env_ready: int = 2) -> None:
    """Play the controllers: every workload's pods become ready and the trainer runs."""
    for resource, child, ready in (
        (DEPLOYMENTS, f"{name}-rollout", 1),
        (STATEFULSETS, f"{name}-learner", 1),
        (DEPLOYMENTS, f"{name}-env", env_ready),
    ):
        await cluster.emulator.set_status(resource, NAMESPACE, child, {"readyReplicas": ready})
    await cluster.emulator.set_status(
        JOBS,
        NAMESPACE,
        f"{name}-trainer",
        {"active": 1, "ready": 1, "startTime": "2026-01-01T00:00:00Z"},
    )


async def test_a_run_becomes_every_child_with_its_key_fields(cluster: Cluster):
    created = await cluster.create_run("demo", FULL)
    uid = created["metadata"]["uid"]
    await cluster.eventually(lambda: cluster.child(JOBS, "demo-trainer"), what="the trainer Job")

    for resource, name in CHILDREN:
        obj = cluster.child(resource, name)
        assert obj is not None, f"{resource} {name} was not created"
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner["uid"] == uid and owner["controller"] and owner["blockOwnerDeletion"]
        assert obj["metadata"]["labels"]["aflowrl.io/run"] == "demo"
        if resource != "monitoring.coreos.com/v1/podmonitors":  # no schema ships for CRDs
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)

    spec_yaml = cluster.child("v1/configmaps", "demo-spec")["data"]["spec.yaml"]
    # the spec as given, with the images it leaves unset filled in by the operator's defaults
    resolved = with_default_images(RunSpec.from_document(FULL), ImageDefaults())
    assert RunSpec.from_yaml(spec_yaml) == resolved

    rollout = cluster.child(DEPLOYMENTS, "demo-rollout")
    main = _container(rollout)
    assert rollout["spec"]["replicas"] == 2
    assert main["command"][:5] == [
        "aflowrl",
        "serve",
        "rollout",
        "-f",
        "/etc/aflowrl/spec.yaml",
    ]
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert main["readinessProbe"]["grpc"]["port"] == 50050  # TLS: the plaintext health port
    pod = rollout["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpu": "h100"} and pod["tolerations"][0]["operator"] == "Exists"
    assert pod["priorityClassName"] == "training"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert mounts["/models"]["readOnly"] and "/checkpoints" in mounts  # filesystem transport

    learner = cluster.child(STATEFULSETS, "demo-learner")
    assert learner["spec"]["replicas"] == 2
    assert learner["spec"]["podManagementPolicy"] == "Parallel"
    assert _container(learner)["command"] == [
        "torchrun", "--nnodes", "2", "--nproc-per-node", "4", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"demo-learner-0.demo-learner.{NAMESPACE}.svc:29500",
        "--rdzv-id", "demo", "-m", "aflowrl", "serve", "learner",
        "-f", "/etc/aflowrl/spec.yaml",
    ]  # fmt: skip
    learner_svc = cluster.child(SERVICES, "demo-learner")["spec"]
    assert learner_svc["clusterIP"] == "None" and learner_svc["publishNotReadyAddresses"]
    assert {p["name"] for p in learner_svc["ports"]} == {"grpc", "rendezvous", "metrics"}

    env = cluster.child(DEPLOYMENTS, "demo-env")
    assert env["spec"]["replicas"] == 2
    variables = _env(env)
    assert variables["AFLOWRL_DATA_DIR"] == "/data"
    assert variables["AFLOWRL_EXECUTOR_BASE_URL"] == f"http://demo-executor.{NAMESPACE}.svc:8000/v1"
    assert variables["AFLOWRL_AUTH_TOKEN_FILE"] == "/var/run/aflowrl/auth/token"
    assert variables["AFLOWRL_TLS_DIR"] == "/var/run/aflowrl/tls"
    assert "nodeSelector" not in env["spec"]["template"]["spec"]  # a CPU pod
    assert cluster.child(SERVICES, "demo-env")["spec"]["clusterIP"] == "None"
    hpa = cluster.child(HPAS, "demo-env")["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 6)
    egress = cluster.child("networking.k8s.io/v1/networkpolicies", "demo-env-egress")["spec"]
    assert egress["policyTypes"] == ["Egress"]
    assert egress["egress"][1]["to"][0]["podSelector"]["matchLabels"] == {
        "aflowrl.io/run": "demo",
        "app.kubernetes.io/component": "executor",
    }

    executor = _container(cluster.child(DEPLOYMENTS, "demo-executor"))
    assert executor["command"][:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert (
        executor["command"][executor["command"].index("--served-model-name") + 1] == "qwen-executor"
    )

    job = cluster.child(JOBS, "demo-trainer")
    assert job["spec"]["suspend"] is False
    assert _container(job)["command"] == [
        "aflowrl", "train", "-f", "/etc/aflowrl/spec.yaml",
        "--env", f"dns:///demo-env.{NAMESPACE}.svc:50051",
        "--rollout", f"dns:///demo-rollout.{NAMESPACE}.svc:50052",
        "--learner", f"dns:///demo-learner-0.demo-learner.{NAMESPACE}.svc:50053",
        "--run-dir", "/checkpoints",
    ]  # fmt: skip
    trainer_pod = job["spec"]["template"]["spec"]
    assert trainer_pod["serviceAccountName"] == "demo-trainer"
    assert trainer_pod["automountServiceAccountToken"] is True
    assert (
        _env(job)["AFLOWRL_RUN_NAME"] == "demo" and _env(job)["AFLOWRL_RUN_NAMESPACE"] == NAMESPACE
    )
    (rule,) = cluster.child("rbac.authorization.k8s.io/v1/roles", "demo-trainer")["rules"]
    assert rule == {
        "apiGroups": ["aflowrl.io"],
        "resources": ["trainingruns/status"],
        "resourceNames": ["demo"],
        "verbs": ["get", "patch"],
    }
    claim = cluster.child("v1/persistentvolumeclaims", "demo-checkpoints")["spec"]
    assert claim["resources"]["requests"]["storage"] == "100Gi"
    assert claim["accessModes"] == ["ReadWriteMany"]
    monitor = cluster.child("monitoring.coreos.com/v1/podmonitors", "demo")
    assert monitor["metadata"]["labels"]["release"] == "prom"

    for resource, name in CHILDREN:
        obj = cluster.child(resource, name)
        if "template" not in obj.get("spec", {}):
            continue
        pod = obj["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
            assert sc["capabilities"] == {"drop": ["ALL"]}

    status = await cluster.eventually(
        lambda: (
            cluster.run("demo").get("status", {}).get("conditions")
            and cluster.run("demo")["status"]
        ),
        what="a status",
    )
    assert status["observedGeneration"] == 1
    assert [c["type"] for c in status["conditions"]] == list(CONDITION_TYPES)
    ready = cluster.condition("demo", "Ready")
    assert ready["status"] == "False" and ready["reason"] == "ComponentsStarting"
    assert "0/2 rollout pods ready" in ready["message"]
    # kopf keeps its bookkeeping in aflowrl.io annotations, with keys Kubernetes accepts.
    keys = await cluster.eventually(
        lambda: [
            k
            for k in cluster.run("demo")["metadata"].get("annotations", {})
            if k.startswith("aflowrl.io/")
        ],
        what="kopf's annotations",
    )
    annotation = re.compile(r"^aflowrl\.io/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
    assert all(annotation.match(key) for key in keys), keys


async def test_ready_then_degraded_when_a_child_becomes_unavailable(cluster: Cluster):
    await cluster.create_run("demo", TINY)
    await cluster.eventually(lambda: cluster.child(JOBS, "demo-trainer"), what="the Job")
    await _children_ready(cluster)
    await cluster.wait_condition("demo", "Ready", status="True")
    assert cluster.condition("demo", "Ready")["reason"] == "Training"
    assert cluster.condition("demo", "Degraded")["status"] == "False"

    await cluster.emulator.set_status(DEPLOYMENTS, NAMESPACE, "demo-env", {"readyReplicas": 1})
    degraded = await cluster.wait_condition("demo", "Degraded", status="True")
    assert degraded["reason"] == "ReplicasUnavailable"
    assert "1/2 environment pods ready" in degraded["message"]
    env_ready = cluster.condition("demo", "EnvironmentReady")
    assert (env_ready["status"], env_ready["reason"]) == ("False", "ReplicasUnavailable")
    assert cluster.condition("demo", "Ready")["reason"] == "ReplicasUnavailable"
    assert cluster.run("demo")["status"]["environmentReadyReplicas"] == 1

    # A pod of the environment crash-loops: the reason says so.
    await cluster.emulator.put_object(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "demo-env-abc",
                "namespace": NAMESPACE,
                "labels": {"aflowrl.io/run": "demo", "app.kubernetes.io/component": "environment"},
            },
            "status": {
                "containerStatuses": [
                    {
                        "name": "environment",
                        "state": {
                            "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}
                        },
                    }
                ]
            },
        },
    )
    await cluster.wait_condition("demo", "Degraded", reason="CrashLoopBackOff")
    await cluster.emulator.delete_object(PODS, NAMESPACE, "demo-env-abc")
    await cluster.emulator.set_status(DEPLOYMENTS, NAMESPACE, "demo-env", {"readyReplicas": 2})
    await cluster.wait_condition("demo", "Degraded", status="False")
    assert cluster.condition("demo", "Ready")["status"] == "True"


async def test_environment_replicas_scale_without_restarting_pods(cluster: Cluster):
    await cluster.create_run("demo", TINY)
    await cluster.eventually(lambda: cluster.child(JOBS, "demo-trainer"), what="the Job")
    rollout_hash = cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["template"]["metadata"]

    await cluster.patch_spec("demo", {"environment": {"replicas": {"min": 3, "max": 5}}})
    await cluster.eventually(
        lambda: cluster.child(HPAS, "demo-env")["spec"]["minReplicas"] == 3, what="the HPA"
    )
    assert cluster.child(HPAS, "demo-env")["spec"]["maxReplicas"] == 5
    await cluster.eventually(
        lambda: cluster.child(DEPLOYMENTS, "demo-env")["spec"]["replicas"] == 3, what="min"
    )
    # The HPA scales up within the bounds: the operator leaves its count alone...
    await cluster.emulator.patch_object(
        DEPLOYMENTS, NAMESPACE, "demo-env", {"spec": {"replicas": 4}}
    )
    before = cluster.emulator.count_changed("deployments", "demo-env")
    rollout_writes = cluster.emulator.count_changed("deployments", "demo-rollout")
    learner_writes = cluster.emulator.count_changed("statefulsets", "demo-learner")
    await cluster.settle()
    assert cluster.run("demo")["status"]["observedGeneration"] == 2
    assert cluster.child(DEPLOYMENTS, "demo-env")["spec"]["replicas"] == 4
    assert cluster.emulator.count_changed("deployments", "demo-env") == before
    # ...and clamps it when the bounds shrink below it.
    await cluster.patch_spec("demo", {"environment": {"replicas": {"min": 1, "max": 2}}})
    await cluster.eventually(
        lambda: cluster.child(DEPLOYMENTS, "demo-env")["spec"]["replicas"] == 2, what="max"
    )
    assert cluster.emulator.count_changed("deployments", "demo-env") > before
    # Replica counts are not part of the pods' spec hash: nothing else rolled (every pass
    # applies every child, and these applies changed nothing).
    assert (
        cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["template"]["metadata"] == rollout_hash
    )
    assert cluster.emulator.count_changed("deployments", "demo-rollout") == rollout_writes
    assert cluster.emulator.count_changed("statefulsets", "demo-learner") == learner_writes
    # The HPA's count is its own: the operator's apply never names the environment's replicas.
    managers = cluster.emulator.managers(DEPLOYMENTS, NAMESPACE, "demo-env")
    assert ("spec", "replicas") not in managers["aflowrl-operator"]
    assert ("spec", "template", "spec", "containers") in managers["aflowrl-operator"]


async def test_suspend_scales_to_zero_and_resume_brings_the_run_back(cluster: Cluster):
    await cluster.create_run("demo", TINY)
    await cluster.eventually(lambda: cluster.child(JOBS, "demo-trainer"), what="the Job")
    await _children_ready(cluster)
    # The trainer reports its progress through the status subresource, as in a pod.
    reporter = RunStatusReporter(name="demo", namespace=NAMESPACE, api_url=cluster.url)
    assert await reporter.areport(iteration=7, best_score=0.81, policy_version=7)
    await cluster.wait_condition("demo", "Ready", status="True")
    job_uid = cluster.child(JOBS, "demo-trainer")["metadata"]["uid"]

    await cluster.patch_spec("demo", {"suspend": True})
    await cluster.eventually(
        lambda: cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is True, what="suspend"
    )
    for resource, name in (
        (DEPLOYMENTS, "demo-rollout"),
        (STATEFULSETS, "demo-learner"),
        (DEPLOYMENTS, "demo-env"),
    ):
        await cluster.eventually(
            lambda r=resource, n=name: cluster.child(r, n)["spec"]["replicas"] == 0, what=name
        )
    for resource, name, ready in (
        (DEPLOYMENTS, "demo-rollout", 0),
        (STATEFULSETS, "demo-learner", 0),
        (DEPLOYMENTS, "demo-env", 0),
    ):
        await cluster.emulator.set_status(resource, NAMESPACE, name, {"readyReplicas": ready})
    await cluster.emulator.set_status(JOBS, NAMESPACE, "demo-trainer", {"active": 0})
    ready = await cluster.wait_condition("demo", "Ready", reason="Suspended")
    assert ready["status"] == "False"
    assert cluster.condition("demo", "Degraded")["status"] == "False"
    assert cluster.condition("demo", "TrainerRunning")["reason"] == "Suspended"

    # Editing the trainer's settings while suspended replaces the idle Job (new template).
    await cluster.patch_spec("demo", {"trainer": {"iterations": 40}})
    await cluster.eventually(
        lambda: cluster.child(JOBS, "demo-trainer")["metadata"]["uid"] != job_uid, what="new Job"
    )
    assert cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is True

    await cluster.patch_spec("demo", {"suspend": False})
    await cluster.eventually(
        lambda: cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is False, what="resume"
    )
    await cluster.eventually(
        lambda: cluster.child(DEPLOYMENTS, "demo-env")["spec"]["replicas"] == 2
    )
    assert cluster.child(DEPLOYMENTS, "demo-rollout")["spec"]["replicas"] == 1
    assert cluster.child(STATEFULSETS, "demo-learner")["spec"]["replicas"] == 1
    status = cluster.run("demo")["status"]
    assert (status["iteration"], status["bestScore"], status["policyVersion"]) == (7, 0.81, 7)
    assert status["totalIterations"] == 40
    await _children_ready(cluster)
    ready = await cluster.wait_condition("demo", "Ready", status="True")
    assert ready["message"] == "iteration 7 of 40"


async def test_an_invalid_spec_is_rejected_with_a_condition_then_fixed(cluster: Cluster):
    await cluster.create_run("bad", {"trainer": {"iterations": -1}, "learner": {"nodez": 2}})
    ready = await cluster.eventually(lambda: cluster.condition("bad", "Ready"), what="status")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    degraded = cluster.condition("bad", "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "InvalidSpec"
    assert "spec.trainer.iterations" in degraded["message"]
    assert "spec.learner.nodez: unknown field" in degraded["message"]
    assert cluster.child("v1/configmaps", "bad-spec") is None
    assert cluster.child(JOBS, "bad-trainer") is None
    # kopf answered the permanent error with a Warning event naming the problem.
    events = await cluster.eventually(
        lambda: [
            e
            for plural in ("v1/events", "events.k8s.io/v1/events")
            for e in cluster.emulator.all(plural, NAMESPACE)
            if "InvalidSpec" in json.dumps(e)
        ],
        what="an event",
    )
    assert events

    await cluster.emulator.patch_object(
        RUNS, NAMESPACE, "bad", {"spec": {"trainer": {"iterations": 5}, "learner": {"nodez": None}}}
    )
    await cluster.eventually(lambda: cluster.child(JOBS, "bad-trainer"), what="children")
    await cluster.wait_condition("bad", "Degraded", status="False")
    assert cluster.run("bad")["status"]["observedGeneration"] == 2


async def test_an_immutable_change_is_rejected_and_the_run_keeps_its_spec(cluster: Cluster):
    await cluster.create_run("demo", TINY)
    await cluster.eventually(lambda: cluster.child(JOBS, "demo-trainer"), what="the Job")
    accepted = cluster.child("v1/configmaps", "demo-spec")["data"]["spec.yaml"]

    await cluster.patch_spec("demo", {"policy": {"model": "/models/other"}, "suspend": True})
    degraded = await cluster.wait_condition("demo", "Degraded", status="True")
    assert degraded["reason"] == "ImmutableFieldChanged"
    assert "spec.policy.model cannot change" in degraded["message"]
    assert "'/models/other'" in degraded["message"]
    assert cluster.run("demo")["status"]["observedGeneration"] == 2
    # Nothing of the rejected change was applied, not even its allowed part.
    assert cluster.child("v1/configmaps", "demo-spec")["data"]["spec.yaml"] == accepted
    assert cluster.child(JOBS, "demo-trainer")["spec"]["suspend"] is False

    await cluster.patch_spec("demo", {"policy": {"model": "tiny"}})
    await cluster.wait_condition("demo", "Degraded", status="False")
    await cluster.eventually(lambda: cluster.child(JOBS, "demo-trainer")["spec"]["suspend"])
    assert yaml.safe_load(cluster.child("v1/configmaps", "demo-spec")["data"]["spec.yaml"])[
        "suspend"
    ]


async def test_deleting_a_run_removes_its_children_for_good(cluster: Cluster):
    await cluster.create_run("demo", TINY)
    await cluster.eventually(lambda: cluster.child(JOBS, "demo-trainer"), what="the Job")
    await cluster.settle()  # passes (events and resyncs) have run: still no finalizer
    assert not cluster.run("demo")["metadata"].get("finalizers")
    await cluster.emulator.delete_object(RUNS, NAMESPACE, "demo")
    await cluster.eventually(
        lambda: cluster.emulator.read(RUNS, NAMESPACE, "demo") is None, what="the deletion"
    )
    assert cluster.child(DEPLOYMENTS, "demo-env") is None  # garbage-collected by owner

    creations = cluster.emulator.count_created("deployments")
    await asyncio.sleep(5 * RESYNC_S)  # several resync intervals: nothing comes back
    assert cluster.emulator.count_created("deployments") == creations
    leftovers = [
        (res, obj["metadata"]["name"])
        for res in RESOURCES
        if res not in {"v1/events", "events.k8s.io/v1/events"}
        for obj in cluster.emulator.all(res, NAMESPACE)
    ]
    assert leftovers == []


async def test_an_operator_restart_mid_pass_creates_nothing_twice(cluster: Cluster):
    # Passes die at the Job's apply (child events start more passes than one: keep failing).
    cluster.emulator.fail_next("PATCH", "jobs", times=10_000)
    await cluster.create_run("demo", TINY)
    await cluster.eventually(lambda: cluster.child(HPAS, "demo-env"), what="a partial pass")
    await cluster.stop_operator()
    cluster.emulator.clear_failures()
    assert cluster.child(JOBS, "demo-trainer") is None
    await cluster.emulator.delete_object(SERVICES, NAMESPACE, "demo-env")  # drift meanwhile
    changes_before = len([w for w in cluster.emulator.changed if w[0] != "trainingruns"])

    await cluster.start_operator()
    await cluster.eventually(lambda: cluster.child(JOBS, "demo-trainer"), what="the Job")
    await cluster.eventually(lambda: cluster.child(SERVICES, "demo-env"), what="the Service")
    for plural, name in (
        ("configmaps", "demo-spec"),
        ("deployments", "demo-rollout"),
        ("deployments", "demo-env"),
        ("statefulsets", "demo-learner"),
        ("horizontalpodautoscalers", "demo-env"),
        ("jobs", "demo-trainer"),
    ):
        assert cluster.emulator.count_created(plural, name) == 1, (plural, name)
    assert cluster.emulator.count_created("services", "demo-env") == 2  # re-created once
    changes_after = len([w for w in cluster.emulator.changed if w[0] != "trainingruns"])
    assert changes_after == changes_before  # everything else was already right


async def test_more_gpus_per_pod_than_any_node_offers_is_unschedulable(cluster: Cluster):
    for name, gpus in (("gpu-a", "4"), ("gpu-b", "2"), ("cpu-a", "0")):
        await cluster.emulator.put_object(
            "v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"pool": "main"}},
                "status": {"allocatable": {"cpu": "64", "nvidia.com/gpu": gpus}},
            },
        )
    spec = {"learner": {"procsPerNode": 8, "resources": {"gpus": 8}}, **TINY}
    await cluster.create_run("big", spec)
    degraded = await cluster.wait_condition("big", "Degraded", status="True")
    assert degraded["reason"] == "Unschedulable"
    assert "learner pods ask for 8 nvidia.com/gpu each" in degraded["message"]
    assert "the largest node offers 4 (gpu-a: 4, gpu-b: 2, cpu-a: 0)" in degraded["message"]
    assert cluster.condition("big", "Ready")["reason"] == "Unschedulable"
    # The children exist anyway: a node the autoscaler adds later clears the condition.
    assert cluster.child(STATEFULSETS, "big-learner") is not None
    await cluster.emulator.put_object(
        "v1/nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "gpu-c", "labels": {"pool": "main"}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}},
        },
    )
    await cluster.wait_condition("big", "Degraded", status="False")


def test_the_emulator_declares_every_kind_the_operator_uses():
    from aflowrl_operator.kube import KINDS

    declared = {
        kind
        for table in (RESOURCES, MONITORING, KUEUE, COSCHEDULING, PEERING, GROUPS)
        for kind, _, _ in table.values()
    }
    assert set(KINDS) <= declared
    assert isinstance(KubeEmulator, type)


async def test_the_chart_grants_every_request_the_operator_makes(cluster: Cluster):
    """Drive every code path that talks to the API, then check each request against the
    chart's default RBAC: least privilege must still be enough."""
    await cluster.emulator.put_object(
        "v1/nodes",
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}, "status": {}},
    )
    await cluster.create_run("demo", FULL)
    await cluster.eventually(lambda: cluster.child(JOBS, "demo-trainer"), what="the Job")
    await cluster.patch_spec("demo", {"suspend": True})
    await cluster.eventually(lambda: cluster.child(JOBS, "demo-trainer")["spec"]["suspend"])
    await cluster.patch_spec("demo", {"trainer": {"iterations": 30}})  # replaces the idle Job
    await cluster.settle()
    await cluster.patch_spec(
        "demo",
        {
            "suspend": False,
            "environment": {
                "executor": {"serve": None, "baseUrl": "https://llm.example/v1"},
                "podDisruptionBudget": None,
            },
            "monitoring": {"serviceMonitor": {"enabled": False}},
        },
    )
    await cluster.eventually(
        lambda: cluster.child(DEPLOYMENTS, "demo-executor") is None, what="executor removal"
    )
    await cluster.eventually(
        lambda: cluster.child("policy/v1/poddisruptionbudgets", "demo-env") is None,
        what="the disruption budget's removal",
    )
    await cluster.eventually(
        lambda: cluster.child("monitoring.coreos.com/v1/podmonitors", "demo") is None
    )
    await cluster.emulator.delete_object(RUNS, NAMESPACE, "demo")
    await cluster.eventually(lambda: cluster.emulator.read(RUNS, NAMESPACE, "demo") is None)

    made = cluster.emulator.operator_requests()
    assert {
        ("create", "", "events"),
        ("list", "", "nodes"),
        ("delete", "apps", "deployments"),
        ("patch", "policy", "poddisruptionbudgets"),
        ("delete", "policy", "poddisruptionbudgets"),
    } <= made
    assert {
        ("watch", "aflowrl.io", "trainingruns"),
        ("patch", "aflowrl.io", "trainingruns/status"),
    } <= made
    denied = chart_denies(made)
    assert denied == [], f"the chart's RBAC refuses requests the operator makes: {denied}"
