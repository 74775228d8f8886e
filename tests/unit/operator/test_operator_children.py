"""The children the operator builds: valid Kubernetes objects with the fields that matter."""

from __future__ import annotations

import copy
import datetime

import kubernetes_validate
import pytest

import leaderworkerset
from aflowrl.config import ConfigError, RunSpec
from aflowrl_operator import children, groups, kueue, workloads
from aflowrl_operator.names import COMPONENT_LABEL, RunRef

K8S_VERSION = "1.30.0"
RUN = RunRef(name="demo", namespace="team-a", uid="0a1b2c")
RUNNING = children.Scale(services=True, environment_replicas=2, trainer_suspended=False)

SPECS: dict[str, dict] = {
    "tiny": {},
    "gsm8k-8gpu": {
        "policy": {
            "model": "/models/Qwen2.5-7B-Instruct",
            "persistentVolumeClaim": "models",
            "lora": {"rank": 64},
        },
        "rollout": {
            "engine": "vllm",
            "resources": {"cpu": "16", "memory": "128Gi", "gpus": 4},
            "vllm": {"tensorParallelSize": 4},
        },
        "learner": {"procsPerNode": 4, "resources": {"cpu": "32", "memory": "256Gi", "gpus": 4}},
        "environment": {
            "benchmarks": ["gsm8k"],
            "data": {"dir": "/data", "persistentVolumeClaim": "datasets"},
            "executor": {
                "type": "openai",
                "baseUrl": "https://api.openai.com/v1",
                "apiKeySecret": {"name": "openai", "key": "api-key"},
            },
        },
        "weightTransport": {"type": "nccl"},
        "storage": {"size": "200Gi"},
    },
    "multi-node": {
        "learner": {"nodes": 4, "procsPerNode": 8, "resources": {"gpus": 8, "memory": "512Gi"}},
        "rollout": {"replicas": 4, "engine": "vllm", "resources": {"gpus": 1}},
        "environment": {
            "executor": {"type": "openai", "serve": {"model": "/models/exec", "replicas": 2}},
            "replicas": {"min": 4, "max": 32},
        },
        "weightTransport": {"type": "filesystem", "path": "/ckpt/weights"},
        "trainer": {"checkpointDir": "/ckpt"},
        "storage": {"size": "2Ti", "accessMode": "ReadWriteMany", "storageClassName": "nfs"},
        "monitoring": {"serviceMonitor": {"enabled": True}},
        "grpc": {"tlsSecret": "grpc-tls", "authTokenSecret": {"name": "tok", "key": "t"}},
        "scheduling": {
            "nodeSelector": {"nvidia.com/gpu.product": "H100"},
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
        },
    },
    "gpu-cluster": {
        "policy": {"model": "/models/Qwen2.5-7B-Instruct", "persistentVolumeClaim": "models"},
        "rollout": {
            "replicas": 2,
            "engine": "vllm",
            "resources": {"cpu": "8", "memory": "64Gi", "gpus": 1, "shmSize": "8Gi"},
            "pod": {
                "labels": {"team": "rl"},
                "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": "topology.kubernetes.io/zone",
                        "whenUnsatisfiable": "ScheduleAnyway",
                    }
                ],
            },
        },
        "learner": {
            "nodes": 2,
            "procsPerNode": 8,
            "resources": {"cpu": "64", "memory": "1Ti", "gpus": 8, "rdma": 1, "shmSize": "64Gi"},
            "pod": {
                "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                "affinity": {
                    "podAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "weight": 100,
                                "podAffinityTerm": {
                                    "labelSelector": {"matchLabels": {"aflowrl.io/run": "demo"}},
                                    "topologyKey": "network.example.com/rack",
                                },
                            }
                        ]
                    }
                },
                "priorityClassName": "training-high",
            },
        },
        "environment": {"pod": {"runtimeClassName": "gvisor"}},
        "trainer": {"pod": {"tolerations": [{"key": "batch", "operator": "Exists"}]}},
        "weightTransport": {"type": "filesystem"},
        "storage": {"size": "1Ti", "accessMode": "ReadWriteMany"},
        "scheduling": {
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "priorityClassName": "training",
            "gang": {"scheduleTimeoutSeconds": 900},
        },
        "nccl": {"socketIfname": "eth0", "ibHca": "mlx5", "env": {"NCCL_IB_GID_INDEX": "3"}},
    },
}


def _manifests(
    spec: RunSpec, scale: children.Scale = RUNNING, *, group_api: bool = True
) -> list[dict]:
    return children.full_manifests(RUN, spec, scale, monitoring_api=True, group_api=group_api)


def _by(manifests: list[dict], kind: str, name: str) -> dict:
    return next(m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name)


def _containers(manifests: list[dict]):
    for m in manifests:
        template = m.get("spec", {}).get("template") or groups.pod_template_of(m)
        if template:
            yield m, template["spec"], template["spec"]["containers"]
        if m["kind"] == groups.KIND:
            worker = m["spec"]["leaderWorkerTemplate"]["workerTemplate"]
            yield m, worker["spec"], worker["spec"]["containers"]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_child_is_a_valid_kubernetes_object(name):
    spec = RunSpec.from_document(SPECS[name])
    manifests = _manifests(spec)
    assert len({(m["kind"], m["metadata"]["name"]) for m in manifests}) == len(manifests)
    for manifest in manifests:
        if manifest["kind"] in {"PodMonitor", "PodGroup"}:  # CRDs: kubernetes-validate has none
            assert manifest["apiVersion"] in {
                "monitoring.coreos.com/v1",
                "scheduling.x-k8s.io/v1alpha1",
            }
            continue
        if manifest["kind"] == "LeaderWorkerSet":
            leaderworkerset.validate(manifest, K8S_VERSION)
        else:
            kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
        assert manifest["metadata"]["ownerReferences"] == [RUN.owner_reference()]


def test_strict_validation_really_rejects_unknown_fields():
    deployment = copy.deepcopy(_by(_manifests(RunSpec()), "Deployment", "demo-env"))
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_pod_is_locked_down(name):
    for manifest, pod, containers in _containers(_manifests(RunSpec.from_document(SPECS[name]))):
        where = f"{manifest['kind']} {manifest['metadata']['name']}"
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["runAsUser"] != 0, where
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert pod["automountServiceAccountToken"] is (manifest["kind"] == "Job"), where
        for container in containers:
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            rdma = "rdma/ib" in container["resources"]["limits"]
            assert sc["capabilities"] == (
                {"drop": ["ALL"], "add": ["IPC_LOCK"]} if rdma else {"drop": ["ALL"]}
            ), where
            assert "privileged" not in sc, where
            assert container["resources"]["requests"]["memory"], where
            mounts = {m["mountPath"] for m in container["volumeMounts"]}
            assert "/tmp" in mounts, f"{where}: no writable /tmp on a read-only root"


def test_commands_are_the_contracted_entry_points():
    spec = RunSpec.from_document(SPECS["multi-node"])
    manifests = _manifests(spec)

    def command(kind: str, name: str) -> list[str]:
        template = groups.pod_template_of(_by(manifests, kind, name))
        assert template is not None
        return template["spec"]["containers"][0]["command"]

    spec_args = ["-f", "/etc/aflowrl/spec.yaml", "--host", "0.0.0.0"]
    assert command("Deployment", "demo-env") == ["aflowrl", "serve", "env", *spec_args]
    assert command("Deployment", "demo-rollout") == ["aflowrl", "serve", "rollout", *spec_args]
    assert command("LeaderWorkerSet", "demo-learner") == [
        "torchrun", "--nnodes", "4", "--nproc-per-node", "8",
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "demo-learner-0.demo-learner.team-a.svc:29500",
        "--rdzv-id", "demo",
        "-m", "aflowrl", "serve", "learner", "-f", "/etc/aflowrl/spec.yaml",
    ]  # fmt: skip
    assert command("Job", "demo-trainer") == [
        "aflowrl", "train", "-f", "/etc/aflowrl/spec.yaml",
        "--env", "dns:///demo-env.team-a.svc:50051",
        "--rollout", "dns:///demo-rollout.team-a.svc:50052",
        "--learner", "dns:///demo-learner-0.demo-learner.team-a.svc:50053",
        "--run-dir", "/ckpt",
    ]  # fmt: skip
    for _, _, containers in _containers(manifests):
        env = {e["name"]: e for e in containers[0]["env"]}
        if containers[0]["name"] == "vllm":
            continue
        assert env["AFLOWRL_SPEC_FILE"]["value"] == "/etc/aflowrl/spec.yaml"
        assert env["AFLOWRL_LOG_FORMAT"]["value"] == "json"
        assert env["AFLOWRL_CACHE_DIR"]["value"] == "/cache"
        assert env["AFLOWRL_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert env["AFLOWRL_TLS_DIR"]["value"] == "/var/run/aflowrl/tls"


def test_gpu_pods_get_gpus_placement_and_shared_memory():
    # Without the LeaderWorkerSet API a multi-node learner is a StatefulSet.
    manifests = _manifests(RunSpec.from_document(SPECS["multi-node"]), group_api=False)
    learner = _by(manifests, "StatefulSet", "demo-learner")
    pod = learner["spec"]["template"]["spec"]
    main = pod["containers"][0]
    assert main["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    assert pod["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    # /dev/shm in memory, limited by the pod's memory when no shmSize is given.
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "512Gi"}} in pod[
        "volumes"
    ]
    assert "readinessProbe" not in main  # several nodes: only pod 0 serves gRPC
    assert learner["spec"]["updateStrategy"] == {"type": "OnDelete"}
    env_pod = _by(manifests, "Deployment", "demo-env")["spec"]["template"]["spec"]
    assert "nodeSelector" not in env_pod and "tolerations" not in env_pod

    single = _by(_manifests(RunSpec()), "StatefulSet", "demo-learner")
    assert single["spec"]["template"]["spec"]["containers"][0]["readinessProbe"] == {
        "grpc": {"port": 50053},
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
    }


def test_nccl_transport_opens_the_weight_sync_port():
    manifests = _manifests(RunSpec.from_document(SPECS["gsm8k-8gpu"]))
    learner = _by(manifests, "StatefulSet", "demo-learner")
    ports = {
        p["name"]: p["containerPort"]
        for p in learner["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert ports["weight-sync"] == 29600
    service = _by(manifests, "Service", "demo-learner")
    assert {p["name"] for p in service["spec"]["ports"]} >= {"weight-sync", "rendezvous"}


def _claim_holding(pod_spec: dict, path: str) -> str | None:
    """The PVC a pod reads ``path`` from (None: no mount holds it, or only an emptyDir)."""
    container = pod_spec["containers"][0]
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    for mount in container["volumeMounts"]:
        root = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(root):
            claim = volumes[mount["name"]].get("persistentVolumeClaim")
            return claim["claimName"] if claim else None
    return None


@pytest.mark.parametrize(
    ("transport", "shared"),
    [
        ({"type": "nccl"}, "/checkpoints/weights"),
        ({"type": "nccl", "fallbackPath": "/checkpoints/fallback"}, "/checkpoints/fallback"),
        ({"type": "filesystem"}, "/checkpoints/weights"),
        ({"type": "grpc"}, None),
    ],
)
def test_rollout_and_learner_pods_share_the_transports_weight_directory(transport, shared):
    doc = {"weightTransport": transport, "storage": {"size": "10Gi"}}
    manifests = _manifests(RunSpec.from_document(doc))
    rollout = _by(manifests, "Deployment", "demo-rollout")["spec"]["template"]["spec"]
    learner = _by(manifests, "StatefulSet", "demo-learner")["spec"]["template"]["spec"]
    if shared is None:  # grpc streams the weights: the rollout pods mount no checkpoints
        assert "checkpoints" not in {v["name"] for v in rollout["volumes"]}
        return
    # The nccl fallback reloads from the directory the learner exported to: one claim.
    assert _claim_holding(rollout, shared) == "demo-checkpoints"
    assert _claim_holding(learner, shared) == "demo-checkpoints"


def test_environment_pods_get_the_executor_key_data_and_egress():
    manifests = _manifests(RunSpec.from_document(SPECS["gsm8k-8gpu"]))
    env_dep = _by(manifests, "Deployment", "demo-env")
    container = env_dep["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["AFLOWRL_EXECUTOR_API_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "openai", "key": "api-key"}
    }
    assert env["AFLOWRL_DATA_DIR"]["value"] == "/data"
    assert {"name": "data", "mountPath": "/data", "readOnly": True} in container["volumeMounts"]
    egress = _by(manifests, "NetworkPolicy", "demo-env-egress")["spec"]["egress"]
    assert egress[0] == {
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    }
    assert egress[1]["ports"] == [{"protocol": "TCP", "port": 443}]


def test_the_trainer_pod_gets_the_wandb_key_from_its_secret_only_when_wandb_logs():
    key = {"name": "wandb", "key": "api-key"}
    for loggers, expected in ((["console", "wandb"], True), (["console"], False)):
        doc = {"monitoring": {"loggers": loggers, "wandb": {"apiKeySecret": key}}}
        manifests = _manifests(RunSpec.from_document(doc))
        job = _by(manifests, "Job", "demo-trainer")["spec"]["template"]["spec"]
        env = {e["name"]: e for e in job["containers"][0]["env"]}
        assert ("WANDB_API_KEY" in env) == expected
        if expected:
            assert env["WANDB_API_KEY"] == {
                "name": "WANDB_API_KEY",
                "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}},
            }


@pytest.mark.parametrize(
    ("executor", "expected"),
    [
        ({"type": "surrogate"}, None),
        ({"type": "openai", "baseUrl": "http://gateway.llm:8080/v1"}, 8080),
        ({"type": "openai", "baseUrl": "https://api.example.com/v1"}, 443),
        ({"type": "openai", "serve": {"model": "/models/x"}}, "executor"),
    ],
)
def test_environment_egress_allows_dns_and_the_executor_only(executor, expected):
    spec = RunSpec.from_document({"environment": {"executor": executor}})
    rules = workloads.environment_egress(RUN, spec)["spec"]["egress"]
    assert rules[0]["ports"][0]["port"] == 53 and "to" not in rules[0]
    if expected is None:
        assert len(rules) == 1
    elif expected == "executor":
        assert rules[1]["to"] == [{"podSelector": {"matchLabels": RUN.selector("executor")}}]
        assert rules[1]["ports"] == [{"protocol": "TCP", "port": workloads.EXECUTOR_PORT}]
    else:
        assert rules[1]["ports"] == [{"protocol": "TCP", "port": expected}]


def test_suspension_scales_workloads_to_zero_and_suspends_the_trainer():
    spec = RunSpec.from_document(
        {"suspend": True, "environment": {"executor": {"type": "openai", "serve": {"model": "/m"}}}}
    )
    scale = children.Scale(services=False, environment_replicas=2, trainer_suspended=True)
    desired = children.build(RUN, spec, scale, monitoring_api=False)
    replicas = {c.name: c.replicas for c in desired.children if c.replicas is not None}
    assert replicas == {"demo-executor": 0, "demo-rollout": 0, "demo-learner": 0, "demo-env": 0}
    assert desired.trainer_job["spec"]["suspend"] is True
    assert ("PodMonitor", "demo") not in desired.absent  # no monitoring API: nothing to clean


def test_optional_children_appear_and_disappear_with_the_spec():
    plain = children.build(RUN, RunSpec(), RUNNING, monitoring_api=True)
    names = {(c.kind, c.name) for c in plain.children}
    assert ("Deployment", "demo-executor") not in names
    assert ("PersistentVolumeClaim", "demo-checkpoints") not in names
    assert set(plain.absent) == {
        ("Deployment", "demo-executor"),
        ("Service", "demo-executor"),
        ("PodMonitor", "demo"),
        ("PodGroup", "demo-gpu"),  # no gang scheduling: a PodGroup left from before goes
        ("PodDisruptionBudget", "demo-env"),
        ("NetworkPolicy", "demo-ingress"),  # networkPolicy off: policies left from before go
        ("NetworkPolicy", "demo-egress"),
        ("LeaderWorkerSet", "demo-learner"),
    }
    # One pod per replica: no replica groups, whatever their count was.
    assert {(p.kind, tuple(p.labels.items()), p.keep) for p in plain.pruned} == {
        ("LeaderWorkerSet", (("aflowrl.io/run", "demo"), (COMPONENT_LABEL, c)), frozenset())
        for c in ("rollout", "executor")
    }
    full = children.build(
        RUN, RunSpec.from_document(SPECS["multi-node"]), RUNNING, monitoring_api=True
    )
    names = {(c.kind, c.name) for c in full.children}
    assert {("Deployment", "demo-executor"), ("PodMonitor", "demo")} <= names
    claim = next(c.manifest for c in full.children if c.kind == "PersistentVolumeClaim")
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "2Ti"}},
        "storageClassName": "nfs",
    }


def test_spec_hash_ignores_replica_counts_but_not_settings():
    base = RunSpec()
    scaled = RunSpec.from_document(
        {
            "suspend": True,
            "environment": {"replicas": {"min": 5, "max": 9}},
            "rollout": {"replicas": 3},
        }
    )
    hotter = RunSpec.from_document({"rollout": {"sampling": {"temperature": 0.7}}})
    assert children.spec_hash(base) == children.spec_hash(scaled)
    assert children.spec_hash(base) != children.spec_hash(hotter)
    job_a = children.build(RUN, base, RUNNING, monitoring_api=False).trainer_job
    job_b = children.build(RUN, hotter, RUNNING, monitoring_api=False).trainer_job
    key = "aflowrl.io/template-hash"
    assert job_a["metadata"]["annotations"][key] != job_b["metadata"]["annotations"][key]


@pytest.mark.parametrize(("live", "expected"), [(None, 2), (0, 2), (1, 2), (3, 3), (4, 4), (9, 4)])
def test_environment_replicas_follow_the_autoscaler_within_bounds(live, expected):
    spec = RunSpec.from_document({"environment": {"replicas": {"min": 2, "max": 4}}})
    assert children.environment_replicas(spec, live) == expected


def test_the_config_map_holds_the_resolved_spec():
    spec = RunSpec.from_document(SPECS["gsm8k-8gpu"])
    cm = children.config_map(RUN, spec)
    assert RunSpec.from_yaml(cm["data"]["spec.yaml"]) == spec
    assert "maxModelLen" in cm["data"]["spec.yaml"]  # defaults are spelled out for the pods


def _pod(manifests: list[dict], kind: str, name: str) -> dict:
    template = groups.pod_template_of(_by(manifests, kind, name))
    assert template is not None
    return template


def test_pod_overrides_are_merged_per_component():
    manifests = _manifests(RunSpec.from_document(SPECS["gpu-cluster"]))
    rollout = _pod(manifests, "Deployment", "demo-rollout")
    assert rollout["metadata"]["labels"]["team"] == "rl"
    assert rollout["metadata"]["labels"]["aflowrl.io/run"] == "demo"
    annotations = rollout["metadata"]["annotations"]
    assert annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    assert "aflowrl.io/spec-hash" in annotations
    (spread,) = rollout["spec"]["topologySpreadConstraints"]
    # A constraint without a selector counts the component's own pods.
    assert spread["labelSelector"] == {"matchLabels": RUN.selector("rollout")}
    assert rollout["spec"]["priorityClassName"] == "training"  # scheduling's, not overridden
    assert rollout["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]

    learner = _pod(manifests, "LeaderWorkerSet", "demo-learner")["spec"]
    assert learner["priorityClassName"] == "training-high"  # the override replaces it
    assert learner["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    term = learner["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term[0]["podAffinityTerm"]["topologyKey"] == "network.example.com/rack"

    env = _pod(manifests, "Deployment", "demo-env")["spec"]
    assert env["runtimeClassName"] == "gvisor"
    assert "tolerations" not in env and "nodeSelector" not in env  # a CPU pod
    trainer = _by(manifests, "Job", "demo-trainer")["spec"]["template"]["spec"]
    assert trainer["tolerations"] == [{"key": "batch", "operator": "Exists"}]


def test_gpu_pods_get_nccl_shared_memory_and_rdma():
    manifests = _manifests(RunSpec.from_document(SPECS["gpu-cluster"]))
    learner = _pod(manifests, "LeaderWorkerSet", "demo-learner")["spec"]
    main = learner["containers"][0]
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["NCCL_DEBUG"] == "WARN"
    assert (env["NCCL_SOCKET_IFNAME"], env["NCCL_IB_HCA"]) == ("eth0", "mlx5")
    assert env["NCCL_IB_GID_INDEX"] == "3"
    # RDMA asked for: InfiniBand without a quiet fall-back, and checked at start-up.
    assert (env["NCCL_NET"], env["NCCL_IB_DISABLE"]) == ("IB", "0")
    assert env["AFLOWRL_RDMA_DEVICES"] == "1"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert main["resources"]["limits"]["rdma/ib"] == "1"
    assert main["resources"]["requests"]["rdma/ib"] == "1"
    assert main["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in learner[
        "volumes"
    ]
    rollout = _pod(manifests, "Deployment", "demo-rollout")["spec"]
    rollout_env = {e["name"] for e in rollout["containers"][0]["env"]}
    # vLLM's memory pool refuses expandable segments: its pods do not get them.
    assert "NCCL_DEBUG" in rollout_env and "PYTORCH_CUDA_ALLOC_CONF" not in rollout_env
    assert "NCCL_NET" not in rollout_env and "AFLOWRL_RDMA_DEVICES" not in rollout_env
    assert "add" not in rollout["containers"][0]["securityContext"]["capabilities"]
    env_pod = _pod(manifests, "Deployment", "demo-env")["spec"]
    assert "NCCL_DEBUG" not in {e["name"] for e in env_pod["containers"][0]["env"]}


def test_gang_scheduling_groups_every_gpu_pod():
    manifests = _manifests(RunSpec.from_document(SPECS["gpu-cluster"]))
    group = _by(manifests, "PodGroup", "demo-gpu")
    assert group["spec"] == {"minMember": 2 + 2, "scheduleTimeoutSeconds": 900}
    for kind, name in (("Deployment", "demo-rollout"), ("LeaderWorkerSet", "demo-learner")):
        pod = _pod(manifests, kind, name)
        assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "demo-gpu"
        assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    env = _pod(manifests, "Deployment", "demo-env")
    assert "scheduling.x-k8s.io/pod-group" not in env["metadata"]["labels"]
    assert "schedulerName" not in env["spec"]
    assert not any(m["kind"] == "PodGroup" for m in _manifests(RunSpec()))


TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def test_the_kueue_workload_has_one_pod_set_per_component():
    spec = RunSpec.from_document(SPECS["gpu-cluster"])
    desired = children.build(RUN, spec, RUNNING, monitoring_api=False)
    high = kueue.Priority("high", kueue.WORKLOAD_PRIORITY_CLASS, 1000)
    workload = children.kueue_workload(RUN, spec, desired, queue="team-a", priority=high)
    assert workload["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert workload["metadata"]["ownerReferences"] == [RUN.owner_reference()]
    assert workload["spec"]["queueName"] == "team-a"
    assert workload["spec"]["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "high",
    }
    assert workload["spec"]["priority"] == 1000
    old_api = children.kueue_workload(
        RUN,
        spec,
        desired,
        queue="team-a",
        priority=kueue.Priority("training", kueue.PRIORITY_CLASS, 10),
        api_version="kueue.x-k8s.io/v1beta1",
    )
    assert {k: old_api["spec"][k] for k in ("priorityClassName", "priorityClassSource")} == {
        "priorityClassName": "training",
        "priorityClassSource": "scheduling.k8s.io/priorityclass",
    }
    assert old_api["spec"]["priority"] == 10 and "priorityClassRef" not in old_api["spec"]
    sets = {ps["name"]: ps for ps in workload["spec"]["podSets"]}
    assert {name: ps["count"] for name, ps in sets.items()} == {
        "rollout": 2,
        "learner": 2,
        "environment": 2,  # the autoscaler's ceiling is reserved
        "trainer": 1,
    }
    gpus = sets["learner"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert gpus["nvidia.com/gpu"] == "8"
    # Admission on a flavor puts the pods on its nodes.
    admitted = children.Scale(
        services=True,
        environment_replicas=2,
        trainer_suspended=False,
        placement={
            "learner": kueue.Placement(
                node_selector={"cloud.example.com/pool": "h100-reserved"},
                tolerations=[TAINT],
                labels={"team": "a"},
            ),
            "trainer": kueue.Placement(tolerations=[TAINT]),
        },
    )
    manifests = children.full_manifests(RUN, spec, admitted, monitoring_api=False)
    learner = _pod(manifests, "LeaderWorkerSet", "demo-learner")
    assert learner["spec"]["nodeSelector"]["cloud.example.com/pool"] == "h100-reserved"
    assert TAINT in learner["spec"]["tolerations"]
    assert learner["metadata"]["labels"]["team"] == "a"
    # Every pod of the learner's group is placed: its workers as well as its leader.
    group = next(m for m in manifests if m["kind"] == "LeaderWorkerSet")
    worker = group["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert worker["spec"]["nodeSelector"]["cloud.example.com/pool"] == "h100-reserved"
    assert TAINT in worker["spec"]["tolerations"] and worker["metadata"]["labels"]["team"] == "a"
    # The trainer Job's template hash covers its placement (a new template replaces the Job).
    job = next(m for m in manifests if m["kind"] == "Job")
    assert TAINT in job["spec"]["template"]["spec"]["tolerations"]
    unplaced = children.build(RUN, spec, RUNNING, monitoring_api=False).trainer_job
    assert job["metadata"]["annotations"] != unplaced["metadata"]["annotations"]
    # A change of shape gives a new hash (the operator replaces the Workload).
    bigger = RunSpec.from_document(
        {**SPECS["gpu-cluster"], "rollout": {**SPECS["gpu-cluster"]["rollout"], "replicas": 3}}
    )
    again = children.kueue_workload(
        RUN,
        bigger,
        children.build(RUN, bigger, RUNNING, monitoring_api=False),
        queue="team-a",
        priority=None,
    )
    assert again["metadata"]["annotations"] != workload["metadata"]["annotations"]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_container_leaves_its_log_tail_as_termination_message(name):
    spec = RunSpec.from_document(SPECS[name])
    found = 0
    for _, _, containers in _containers(_manifests(spec)):
        for container in containers:
            assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
            found += 1
    assert found >= 4


def test_the_trainer_job_keeps_failed_pods_and_takes_a_deadline():
    job = children.build(RUN, RunSpec(), RUNNING, monitoring_api=False).trainer_job
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert job["spec"]["backoffLimit"] == workloads.TRAINER_BACKOFF_LIMIT > 0
    assert "activeDeadlineSeconds" not in job["spec"]
    spec = RunSpec.from_document({"trainer": {"activeDeadlineSeconds": 7200}})
    job = children.build(RUN, spec, RUNNING, monitoring_api=False).trainer_job
    assert job["spec"]["activeDeadlineSeconds"] == 7200
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def test_lifecycle_settings_do_not_restart_pods():
    base = RunSpec()
    lifecycle = RunSpec.from_document(
        {
            "trainer": {
                "activeDeadlineSeconds": 600,
                "keepPodsAfterEnd": True,
                "ttlSecondsAfterFinished": 60,
            }
        }
    )
    assert children.spec_hash(lifecycle) == children.spec_hash(base)
    templates = [m["spec"]["template"] for m in _manifests(base) if "template" in m.get("spec", {})]
    assert templates == [
        m["spec"]["template"] for m in _manifests(lifecycle) if "template" in m.get("spec", {})
    ]


KEEP = {"keepPodsAfterEnd": True}


@pytest.mark.parametrize(
    ("trainer", "seconds_after_end", "kept"),
    [
        ({}, 0, False),
        (KEEP, 10 * 365 * 86400, True),
        ({**KEEP, "ttlSecondsAfterFinished": 60}, 59, True),
        ({**KEEP, "ttlSecondsAfterFinished": 60}, 60, False),
        ({**KEEP, "ttlSecondsAfterFinished": 0}, 0, False),
    ],
)
def test_pods_are_kept_after_the_end_until_the_ttl(trainer, seconds_after_end, kept):
    spec = RunSpec.from_document({"trainer": trainer})
    ended = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    at = ended + datetime.timedelta(seconds=seconds_after_end)
    assert children.kept_after_end(spec, "2026-01-01T00:00:00Z", at) is kept


def test_the_environment_gets_a_disruption_budget_only_when_asked():
    assert not any(m["kind"] == "PodDisruptionBudget" for m in _manifests(RunSpec()))
    desired = children.build(RUN, RunSpec(), RUNNING, monitoring_api=False)
    assert ("PodDisruptionBudget", "demo-env") in desired.absent  # removed when dropped
    spec = RunSpec.from_document({"environment": {"podDisruptionBudget": {"maxUnavailable": 2}}})
    manifests = _manifests(spec)
    budget = _by(manifests, "PodDisruptionBudget", "demo-env")
    kubernetes_validate.validate(budget, K8S_VERSION, strict=True)
    assert budget["spec"]["maxUnavailable"] == 2
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    pods = _by(manifests, "Deployment", "demo-env")["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pods.items()
    other = _by(manifests, "Deployment", "demo-rollout")["spec"]["template"]["metadata"]["labels"]
    assert not budget["spec"]["selector"]["matchLabels"].items() <= other.items()
    assert children.spec_hash(spec) == children.spec_hash(RunSpec())  # no pod restarts


def _served_executor(**serve: object) -> dict:
    """An environment whose executor model the run serves over two nodes of 8 GPUs a replica."""
    return {
        "executor": {
            "type": "openai",
            "model": "exec",
            "serve": {
                "model": "/models/exec",
                "nodesPerReplica": 2,
                "resources": {"gpus": 8},
                **serve,
            },
        }
    }


def test_a_multi_node_executor_over_mp_runs_vllm_headless_on_its_workers():
    spec = RunSpec.from_document({"environment": _served_executor()})
    manifests = _manifests(spec)
    group = _by(manifests, "LeaderWorkerSet", "demo-executor-0")
    lwt = group["spec"]["leaderWorkerTemplate"]
    leader = lwt["leaderTemplate"]["spec"]["containers"][0]["command"]
    worker = lwt["workerTemplate"]["spec"]["containers"][0]["command"]
    multinode = ["--nnodes", "2", "--master-addr", "$(LWS_LEADER_ADDRESS)"]
    assert leader[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert worker[:5] == ["python3", "-m", "vllm.entrypoints.cli.main", "serve", "/models/exec"]
    for command in (leader, worker):
        text = " ".join(command)
        assert "--tensor-parallel-size 16 --pipeline-parallel-size 1" in text
        assert "--distributed-executor-backend mp" in text and " ".join(multinode) in text
    assert leader[-2:] == ["--node-rank", "0"]
    assert worker[-3:] == ["--node-rank", "$(LWS_WORKER_INDEX)", "--headless"]
    assert not any(
        m["kind"] == "Deployment" and m["metadata"]["name"] == "demo-executor" for m in manifests
    )
    service = _by(manifests, "Service", "demo-executor")
    assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    assert "clusterIP" not in service["spec"]  # a ClusterIP Service, as for one pod per replica


ROLLING = {  # three rollout replicas of two nodes each
    "rollout": {
        "engine": "vllm",
        "replicas": 3,
        "nodesPerReplica": 2,
        "resources": {"gpus": 8},
        "vllm": {"tensorParallelSize": 8, "pipelineParallelSize": 2},
    }
}


def test_every_multi_node_replica_is_a_leader_worker_set_of_its_own():
    doc = {
        "rollout": copy.deepcopy(ROLLING["rollout"]),
        "environment": _served_executor(replicas=2),
        "learner": {"procsPerNode": 8, "resources": {"gpus": 8}},
        "scheduling": {"gang": {}},
    }
    spec = RunSpec.from_document(doc)
    desired = children.build(RUN, spec, RUNNING, monitoring_api=False)
    sets = {c.name: c for c in desired.children if c.kind == "LeaderWorkerSet"}
    assert set(sets) == {
        "demo-rollout-0", "demo-rollout-1", "demo-rollout-2",
        "demo-executor-0", "demo-executor-1",
    }  # fmt: skip
    for name, child in sets.items():
        assert child.replicas == 1  # one group each
        component, index = name.removeprefix("demo-").split("-")
        meta = child.manifest["metadata"]
        assert meta["labels"]["aflowrl.io/replica"] == index
        assert meta["labels"][COMPONENT_LABEL] == component
        lwt = child.manifest["spec"]["leaderWorkerTemplate"]
        assert lwt["size"] == 2 and lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
        for role in ("leaderTemplate", "workerTemplate"):
            labels = lwt[role]["metadata"]["labels"]
            assert labels["aflowrl.io/replica"] == index
            assert labels["scheduling.x-k8s.io/pod-group"] == "demo-gpu"
    # Only the spec's replicas may exist; the others of the run's are deleted.
    keep = {p.labels[COMPONENT_LABEL]: p.keep for p in desired.pruned}
    assert keep == {
        "rollout": {"demo-rollout-0", "demo-rollout-1", "demo-rollout-2"},
        "executor": {"demo-executor-0", "demo-executor-1"},
    }
    # The Services select every replica's leader.
    service = next(c.manifest for c in desired.children if c.name == "demo-rollout")
    assert service["spec"]["selector"] == {
        "aflowrl.io/run": "demo",
        COMPONENT_LABEL: "rollout",
        "leaderworkerset.sigs.k8s.io/worker-index": "0",
    }
    # Suspended: every replica stays, at zero.
    held = children.Scale(services=False, environment_replicas=2, trainer_suspended=True)
    stopped = children.build(RUN, spec, held, monitoring_api=False)
    assert {c.name: c.replicas for c in stopped.children if c.kind == "LeaderWorkerSet"} == {
        name: 0 for name in sets
    }
    # Kueue sees one Workload, a pod set per component counting every pod of every group; the
    # gang waits for all of them.
    workload = children.kueue_workload(RUN, spec, stopped, queue="gpu", priority=None)
    counts = {ps["name"]: ps["count"] for ps in workload["spec"]["podSets"]}
    assert counts == {"executor": 4, "rollout": 6, "learner": 1, "environment": 2, "trainer": 1}
    assert children.pod_group(RUN, spec)["spec"]["minMember"] == 6 + 4 + 1


def _replica_sets(doc: dict, scale: children.Scale = RUNNING) -> list[tuple[dict, int]]:
    desired = children.build(RUN, RunSpec.from_document(doc), scale, monitoring_api=False)
    return [
        (copy.deepcopy(c.manifest), c.replicas or 0)
        for c in desired.children
        if c.kind == "LeaderWorkerSet" and c.name.startswith("demo-rollout-")
    ]


def _group_pods(group: dict, *, ready: bool = True, phase: str = "Running") -> list[dict]:
    """The pods of a replica's group as the LWS controller makes them from its live object:
    running (``phase``), ready or not."""
    lwt = group["spec"]["leaderWorkerTemplate"]
    return [
        {
            "metadata": {
                "name": f"{group['metadata']['name']}-0-{k}",
                "labels": {
                    **lwt["leaderTemplate"]["metadata"]["labels"],
                    "leaderworkerset.sigs.k8s.io/worker-index": str(k),
                },
                "annotations": lwt["leaderTemplate"]["metadata"]["annotations"],
            },
            "status": {
                "phase": phase,
                "conditions": [{"type": "Ready", "status": str(ready and phase == "Running")}],
            },
        }
        for k in range(lwt["size"])
    ]


def _rolling_replicas() -> tuple[list, dict, list]:
    """Three serving rollout replicas (their live objects) and the sets of a new template."""
    old = _replica_sets(ROLLING)
    live = {m["metadata"]["name"]: {**m, "spec": {**m["spec"], "replicas": 1}} for m, _ in old}
    changed = copy.deepcopy(ROLLING)
    changed["rollout"]["pod"] = {"annotations": {"example.com/team": "rl"}}
    return old, live, _replica_sets(changed)


def _pods_of(live: dict, **states: dict) -> list[dict]:
    """The pods of every live replica: ready and running unless ``states[<replica index>]``
    says otherwise (keyword arguments of :func:`_group_pods`)."""
    return [
        pod
        for group in live.values()
        for pod in _group_pods(group, **states.get(f"r{group['metadata']['name'][-1]}", {}))
    ]


def _live_on(manifest: dict) -> dict:
    return {**manifest, "spec": {**manifest["spec"], "replicas": 1}}


def test_a_new_template_reaches_the_replica_groups_one_at_a_time():
    old, live, new = _rolling_replicas()
    hashes = [m["metadata"]["annotations"]["aflowrl.io/template-hash"] for m, _ in old + new]
    assert len(set(hashes)) == 6  # each replica's own, and every one changed
    pods = _pods_of(live)
    # Every replica serves the old template: the first takes the new one, alone.
    assert groups.held_back(new, live, pods) == {"demo-rollout-1", "demo-rollout-2"}
    # Its group is being recreated: the others wait (its object has the new template, its
    # pods are not ready on it yet).
    live["demo-rollout-0"] = _live_on(new[0][0])
    waiting = [p for p in pods if p["metadata"]["labels"]["aflowrl.io/replica"] != "0"]
    assert groups.held_back(new, live, waiting) == {"demo-rollout-1", "demo-rollout-2"}
    stale = waiting + _group_pods(old[0][0])  # old pods still ready: not the new template
    assert groups.held_back(new, live, stale) == {"demo-rollout-1", "demo-rollout-2"}
    # Back, every pod ready on the new template: the next replica goes.
    back = waiting + _group_pods(live["demo-rollout-0"])
    assert groups.held_back(new, live, back) == {"demo-rollout-2"}
    # A replica that is down (its leader Pending) takes the new template at once; a serving
    # one waits for it.
    down = [p for p in back if p["metadata"]["labels"]["aflowrl.io/replica"] != "2"]
    down += _group_pods(live["demo-rollout-2"], ready=False, phase="Pending")
    assert groups.held_back(new, live, down) == {"demo-rollout-1"}
    # Nothing runs (suspended, held by Kueue): every replica takes it.
    stopped = children.Scale(services=False, environment_replicas=2, trainer_suspended=True)
    changed = copy.deepcopy(ROLLING)
    changed["rollout"]["pod"] = {"annotations": {"example.com/team": "rl"}}
    assert groups.held_back(_replica_sets(changed, stopped), live, pods) == set()
    # What a held replica is applied with: its live template, its new count.
    kept = groups.keep_template(new[1][0], live["demo-rollout-1"])
    assert (
        kept["spec"]["leaderWorkerTemplate"]
        == live["demo-rollout-1"]["spec"]["leaderWorkerTemplate"]
    )
    assert (
        kept["metadata"]["annotations"]["aflowrl.io/template-hash"]
        == live["demo-rollout-1"]["metadata"]["annotations"]["aflowrl.io/template-hash"]
    )


def test_replicas_running_but_not_ready_take_a_new_template_one_per_pass():
    _, live, new = _rolling_replicas()
    not_ready = {"ready": False}
    # Every leader running, none ready (a failing broadcast, probes timing out under load):
    # one replica is replaced, the others keep running the old template.
    pods = _pods_of(live, r0=not_ready, r1=not_ready, r2=not_ready)
    assert groups.held_back(new, live, pods) == {"demo-rollout-1", "demo-rollout-2"}
    # While it comes back, the next waits, however unready the others are.
    live["demo-rollout-0"] = _live_on(new[0][0])
    assert groups.held_back(new, live, pods) == {"demo-rollout-1", "demo-rollout-2"}
    # The one not ready goes before the serving ones, which are not taken down meanwhile.
    _, live, new = _rolling_replicas()
    assert groups.held_back(new, live, _pods_of(live, r1=not_ready)) == {
        "demo-rollout-0",
        "demo-rollout-2",
    }


@pytest.mark.parametrize(
    ("how", "pod_state"),
    [
        ("leader pending", {"phase": "Pending"}),
        ("leader failed", {"phase": "Failed"}),
        ("no pod", None),
        ("at zero", None),
    ],
)
def test_a_replica_that_is_down_takes_a_new_template_at_once(how, pod_state):
    _, live, new = _rolling_replicas()
    states = {"r0": {"ready": False}, "r1": {"ready": False}}
    pods = [
        p
        for p in _pods_of(live, **states, r2=pod_state or {})
        if pod_state is not None or p["metadata"]["labels"]["aflowrl.io/replica"] != "2"
    ]
    if how == "at zero":
        live["demo-rollout-2"]["spec"]["replicas"] = 0
    # Replica 2 is down: it takes the template with the one not-ready replica allowed.
    assert groups.held_back(new, live, pods) == {"demo-rollout-1"}


def test_a_crash_looping_leader_is_down():
    _, live, _ = _rolling_replicas()
    group = live["demo-rollout-0"]
    pods = _group_pods(group, ready=False)
    assert groups.replica_state(group, pods) == groups.NOT_READY
    pods[0]["status"]["containerStatuses"] = [
        {"name": "rollout", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
    ]
    assert groups.replica_state(group, pods) == groups.DOWN
    assert groups.replica_state(group, _group_pods(group)) == groups.SERVING


def test_a_scale_down_in_the_middle_of_a_roll_keeps_one_replica_replacing():
    _, live, new = _rolling_replicas()
    live["demo-rollout-0"] = _live_on(new[0][0])  # replica 0 is being replaced
    pods = [p for p in _pods_of(live) if p["metadata"]["labels"]["aflowrl.io/replica"] != "0"]
    # Down to two replicas: replica 2 is no longer wanted (the reconciler deletes it), and
    # replica 1 still waits for replica 0.
    fewer = new[:2]
    mine = {name: group for name, group in live.items() if name != "demo-rollout-2"}
    assert groups.held_back(fewer, mine, pods) == {"demo-rollout-1"}
    # Down to one, the replica being replaced: nothing else to hold.
    assert groups.held_back(new[:1], {"demo-rollout-0": live["demo-rollout-0"]}, pods) == set()
    # Replica 0 back: replica 1 goes.
    pods += _group_pods(live["demo-rollout-0"])
    assert groups.held_back(fewer, mine, pods) == set()
    # The replica being replaced is the one scaled away: the next of those left goes.
    _, live, new = _rolling_replicas()
    live["demo-rollout-2"] = _live_on(new[2][0])
    pods = [p for p in _pods_of(live) if p["metadata"]["labels"]["aflowrl.io/replica"] != "2"]
    assert groups.held_back(new, live, pods) == {"demo-rollout-0", "demo-rollout-1"}
    mine = {name: group for name, group in live.items() if name != "demo-rollout-2"}
    assert groups.held_back(new[:2], mine, pods) == {"demo-rollout-1"}


@pytest.mark.parametrize(
    ("name", "replicas", "accepted"),
    [("r" * 38, 64, True), ("r" * 39, 9, True), ("r" * 39, 64, False), ("r" * 40, 1, False)],
)
def test_the_longest_names_accepted_leave_the_lws_controller_room(name, replicas, accepted):
    doc = copy.deepcopy(ROLLING)
    doc["rollout"]["replicas"] = replicas
    serve = {"model": "/m", "replicas": replicas, "nodesPerReplica": 2, "resources": {"gpus": 8}}
    doc["environment"] = {"executor": {"type": "openai", "model": "exec", "serve": serve}}
    document = {
        "apiVersion": "aflowrl.io/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": name},
        "spec": doc,
    }
    if not accepted:  # refused, naming the field, before any child is built
        with pytest.raises(ConfigError) as refused:
            RunSpec.from_document(document)
        assert refused.value.fields == ["metadata.name"]
        assert f"{name}-executor-{replicas - 1}" in str(refused.value)
        return
    spec = RunSpec.from_document(document)
    run = RunRef(name=name, namespace="team-a", uid="u")
    desired = children.build(run, spec, RUNNING, monitoring_api=False)
    names = [c.name for c in desired.children if c.kind == "LeaderWorkerSet"]
    assert len(names) == 2 * replicas
    for lws in names:
        # The LWS controller's worker StatefulSet "<lws>-0": its pods carry
        # "<statefulset>-<10-character revision hash>" in a 63-character label.
        assert len(f"{lws}-0-0123456789") <= 63
