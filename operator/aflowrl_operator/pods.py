"""Pod-level building blocks shared by every workload of a run: security, volumes, env, probes,
placement.

Every pod runs as a non-root user with a read-only root filesystem, no privilege escalation, all
capabilities dropped (IPC_LOCK added back for RDMA, which pins memory) and the RuntimeDefault
seccomp profile; writable paths are emptyDirs (/tmp, the cache, a sized memory-backed
``/dev/shm``) or volumes. The run's resolved spec is mounted from its ConfigMap at
``/etc/aflowrl/spec.yaml`` (CONTRACTS.md). Placement merges ``spec.scheduling`` (GPU pods), the
component's ``pod`` overrides, gang scheduling and the node labels of a Kueue admission
(:func:`placement`). Used by :mod:`aflowrl_operator.workloads`.
"""

from __future__ import annotations

import math
from typing import Any

from aflowrl.config import ResourceSpec, RunSpec
from aflowrl.config.scheduling import PodOverrides
from aflowrl_operator.names import POD_GROUP_LABEL, SPEC_HASH, RunRef

SPEC_DIR = "/etc/aflowrl"
SPEC_FILE = f"{SPEC_DIR}/spec.yaml"
"""Where pods read the run's spec (``AFLOWRL_SPEC_FILE``)."""
CACHE_DIR = "/cache"
"""``AFLOWRL_CACHE_DIR``: an emptyDir for built models and evaluation caches."""
MODELS_DIR = "/models"
"""Mount path of ``policy.persistentVolumeClaim`` and of the served executor's model claim."""
AUTH_DIR = "/var/run/aflowrl/auth"
AUTH_FILE = f"{AUTH_DIR}/token"
"""``AFLOWRL_AUTH_TOKEN_FILE`` when ``grpc.authTokenSecret`` is set."""
TLS_DIR = "/var/run/aflowrl/tls"
"""``AFLOWRL_TLS_DIR`` when ``grpc.tlsSecret`` is set."""
RUN_AS = 10001
"""User and group id of every container (the images create this user)."""

JsonDict = dict[str, Any]


def pod_security_context() -> JsonDict:
    """Pod-level security: non-root, fsGroup so volumes are writable, RuntimeDefault seccomp."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(*, ipc_lock: bool = False) -> JsonDict:
    """Container-level security: read-only root, no escalation, every capability dropped but
    IPC_LOCK when ``ipc_lock`` (RDMA registers and pins memory)."""
    capabilities: JsonDict = {"drop": ["ALL"]}
    if ipc_lock:
        capabilities["add"] = ["IPC_LOCK"]
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": capabilities,
    }


def resources(res: ResourceSpec) -> JsonDict:
    """Requests from the spec; memory, GPUs and RDMA devices also as limits (CPU is not capped:
    no throttling)."""
    requests: dict[str, str] = {"cpu": res.cpu, "memory": res.memory}
    limits: dict[str, str] = {"memory": res.memory}
    for name, count in ((res.gpu_resource_name, res.gpus), (res.rdma_resource_name, res.rdma)):
        if count:
            requests[name] = str(count)
            limits[name] = str(count)
    return {"requests": requests, "limits": limits}


def accelerator_env(
    spec: RunSpec, res: ResourceSpec, *, engine: str | None = None
) -> list[JsonDict]:
    """NCCL settings of a learner or rollout pod (``spec.nccl``), and on GPUs the CUDA caching
    allocator's expandable segments (less fragmentation across varying sequence lengths).

    vLLM pods do not get ``PYTORCH_CUDA_ALLOC_CONF``: vLLM's own memory pool (sleep mode, the
    CuMem allocator) refuses expandable segments.
    """
    nccl = spec.nccl
    env: list[JsonDict] = [{"name": "NCCL_DEBUG", "value": nccl.debug}]
    if nccl.socket_ifname is not None:
        env.append({"name": "NCCL_SOCKET_IFNAME", "value": nccl.socket_ifname})
    if nccl.ib_hca is not None:
        env.append({"name": "NCCL_IB_HCA", "value": nccl.ib_hca})
    if res.rdma:
        # InfiniBand / RoCE, and no quiet fall-back to sockets: `aflowrl serve` stops when no
        # device is there (AFLOWRL_RDMA_DEVICES), and NCCL fails rather than use TCP
        # (NCCL_NET=IB). nccl.env overrides any of these (e.g. NCCL_IB_GID_INDEX for RoCE).
        defaults = {
            "AFLOWRL_RDMA_DEVICES": str(res.rdma),
            "NCCL_IB_DISABLE": "0",
            "NCCL_NET": "IB",
        }
        env += [
            {"name": key, "value": value} for key, value in defaults.items() if key not in nccl.env
        ]
    env += [{"name": key, "value": value} for key, value in sorted(nccl.env.items())]
    if res.gpus and engine != "vllm":
        env.append({"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"})
    return env


ROLLOUT_SERVICE = "aflowrl.v1.RolloutService"
"""The rollout's gRPC service: its health is the replica's readiness (the overall health, which
the liveness probe reads, turns NOT_SERVING only for a dead engine)."""


def grpc_probes(spec: RunSpec, port: int, *, ready_service: str = "") -> JsonDict:
    """Startup, readiness and liveness on the standard gRPC health service.

    The startup probe allows 30 minutes (large models load slowly); readiness follows
    ``ready_service``'s SERVING / NOT_SERVING (the overall status when empty); liveness reads the
    overall status: it restarts a server that stops answering at all or reports itself dead.
    A rollout replica waiting for a complete weight version is not ready but alive
    (:data:`ROLLOUT_SERVICE`), so a long reload is never killed.
    With TLS (``grpc.tlsSecret``) the probes go to ``grpc.healthPort``: the kubelet's ``grpc:``
    probe speaks only plaintext, so the server also listens there, plaintext, serving nothing
    but the health service (aflowrl.common.server).
    """
    if spec.grpc.tls_secret is not None:
        port = spec.grpc.health_port
    return {
        "startupProbe": {
            "grpc": {"port": port},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 180,
        },
        "readinessProbe": {
            "grpc": {"port": port, **({"service": ready_service} if ready_service else {})},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "grpc": {"port": port},
            "periodSeconds": 20,
            "timeoutSeconds": 10,
            "failureThreshold": 6,
        },
    }


def base_env(spec: RunSpec) -> list[JsonDict]:
    """Environment every aflow-rl container gets (CONTRACTS.md)."""
    env: list[JsonDict] = [
        {"name": "AFLOWRL_SPEC_FILE", "value": SPEC_FILE},
        {
            "name": "AFLOWRL_POD_NAME",
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
        },
        {"name": "AFLOWRL_LOG_FORMAT", "value": "json"},
        {"name": "AFLOWRL_LOG_LEVEL", "value": spec.monitoring.log_level},
        {"name": "AFLOWRL_CACHE_DIR", "value": CACHE_DIR},
        {"name": "HOME", "value": "/tmp"},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
    ]
    if spec.grpc.auth_token_secret is not None:
        env.append({"name": "AFLOWRL_AUTH_TOKEN_FILE", "value": AUTH_FILE})
    if spec.grpc.tls_secret is not None:
        env.append({"name": "AFLOWRL_TLS_DIR", "value": TLS_DIR})
    return env


def base_volumes(run: RunRef, spec: RunSpec) -> tuple[list[JsonDict], list[JsonDict]]:
    """(volumes, mounts) of every aflow-rl container: spec, /tmp, cache, gRPC secrets."""
    volumes: list[JsonDict] = [
        {"name": "spec", "configMap": {"name": run.config_map}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "cache", "emptyDir": {}},
    ]
    mounts: list[JsonDict] = [
        {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "cache", "mountPath": CACHE_DIR},
    ]
    token = spec.grpc.auth_token_secret
    if token is not None:
        volumes.append(
            {
                "name": "grpc-auth",
                "secret": {
                    "secretName": token.name,
                    "items": [{"key": token.key, "path": "token"}],
                    "defaultMode": 0o440,
                },
            }
        )
        mounts.append({"name": "grpc-auth", "mountPath": AUTH_DIR, "readOnly": True})
    if spec.grpc.tls_secret is not None:
        volumes.append(
            {
                "name": "grpc-tls",
                "secret": {"secretName": spec.grpc.tls_secret, "defaultMode": 0o440},
            }
        )
        mounts.append({"name": "grpc-tls", "mountPath": TLS_DIR, "readOnly": True})
    return volumes, mounts


def shm_volume(res: ResourceSpec) -> tuple[JsonDict, JsonDict]:
    """A memory-backed /dev/shm of ``res.shmSize`` (else the memory request): torch, NCCL and
    vLLM exchange tensors through it, and what they write counts against the memory limit."""
    return (
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": res.shm_size or res.memory}},
        {"name": "dshm", "mountPath": "/dev/shm"},
    )


def models_volume(claim: str) -> tuple[JsonDict, JsonDict]:
    """A model claim mounted read-only at /models."""
    return (
        {"name": "models", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}},
        {"name": "models", "mountPath": MODELS_DIR, "readOnly": True},
    )


def checkpoint_volume(run: RunRef, spec: RunSpec) -> tuple[JsonDict, JsonDict]:
    """trainer.checkpointDir: the run's claim when storage.size is set, else an emptyDir."""
    if spec.storage.size is not None:
        volume: JsonDict = {
            "name": "checkpoints",
            "persistentVolumeClaim": {"claimName": run.checkpoints},
        }
    else:
        volume = {"name": "checkpoints", "emptyDir": {}}
    return volume, {"name": "checkpoints", "mountPath": spec.trainer.checkpoint_dir}


def placement(
    run: RunRef,
    spec: RunSpec,
    component: str,
    *,
    gpu: bool,
    overrides: PodOverrides | None,
    admitted_node_labels: dict[str, str] | None = None,
) -> JsonDict:
    """The pod-spec fields that place a pod: ``spec.scheduling`` (GPU pods; its priority class
    for every pod), then the component's overrides (node selector entries, tolerations added;
    affinity, priority class, runtime class replaced), the node labels of the Kueue flavor the
    run was admitted on, and the gang scheduler."""
    sched = spec.scheduling
    over = overrides or PodOverrides()
    node_selector = dict(sched.node_selector) if gpu else {}
    node_selector.update(over.node_selector)
    node_selector.update(admitted_node_labels or {})
    tolerations = list(sched.tolerations) if gpu else []
    tolerations += over.tolerations
    out: JsonDict = {}
    if node_selector:
        out["nodeSelector"] = node_selector
    if tolerations:
        out["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in tolerations]
    if over.affinity is not None:
        out["affinity"] = over.affinity.model_dump(by_alias=True, exclude_defaults=True)
    if over.topology_spread_constraints:
        constraints = []
        for tsc in over.topology_spread_constraints:
            doc = tsc.model_dump(by_alias=True, exclude_defaults=True)
            # Without a selector a constraint counts no pod at all: count the component's own.
            doc.setdefault("labelSelector", {"matchLabels": run.selector(component)})
            constraints.append(doc)
        out["topologySpreadConstraints"] = constraints
    priority = over.priority_class_name or sched.priority_class_name
    if priority:
        out["priorityClassName"] = priority
    if over.runtime_class_name:
        out["runtimeClassName"] = over.runtime_class_name
    if gpu and sched.gang is not None:
        out["schedulerName"] = sched.gang.scheduler_name
    return out


def pod_template(
    run: RunRef,
    spec: RunSpec,
    component: str,
    *,
    spec_hash: str,
    containers: list[JsonDict],
    volumes: list[JsonDict],
    gpu: bool,
    metrics_port: int | None,
    overrides: PodOverrides | None = None,
    admitted_node_labels: dict[str, str] | None = None,
    service_account: str | None = None,
    restart_policy: str | None = None,
) -> JsonDict:
    """A pod template with the run's labels, security, placement and scrape annotations.

    Placement comes from :func:`placement`; the component's override labels and annotations are
    added under the operator's own. A GPU pod of a gang-scheduled run joins the run's PodGroup.
    Only pods with a ``service_account`` get an API token mounted.
    """
    over = overrides or PodOverrides()
    annotations = {**over.annotations, SPEC_HASH: spec_hash}
    if metrics_port is not None:
        annotations.update(
            {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(metrics_port),
                "prometheus.io/path": "/metrics",
            }
        )
    labels = {**over.labels, **run.labels(component)}
    if gpu and spec.scheduling.gang is not None:
        labels[POD_GROUP_LABEL] = run.pod_group
    pod: JsonDict = {
        "securityContext": pod_security_context(),
        "automountServiceAccountToken": service_account is not None,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": math.ceil(spec.grpc.shutdown_grace_s) + 10,
        "containers": containers,
        "volumes": volumes,
    }
    if service_account is not None:
        pod["serviceAccountName"] = service_account
    if restart_policy is not None:
        pod["restartPolicy"] = restart_policy
    if spec.images.pull_secrets:
        pod["imagePullSecrets"] = [{"name": name} for name in spec.images.pull_secrets]
    pod.update(
        placement(
            run,
            spec,
            component,
            gpu=gpu,
            overrides=over,
            admitted_node_labels=admitted_node_labels,
        )
    )
    return {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod}


def container(
    spec: RunSpec,
    name: str,
    image: str,
    *,
    command: list[str],
    res: ResourceSpec,
    env: list[JsonDict],
    mounts: list[JsonDict],
    ports: list[tuple[str, int]],
    probes: JsonDict | None = None,
) -> JsonDict:
    """One container with the house security context and named ports.

    ``FallbackToLogsOnError``: a container that fails without writing a termination message
    gets the end of its log (the last 80 lines or 2 KiB) as one, so ``kubectl describe pod``
    and the run's ``status.lastError`` show why it died after its log is gone.
    """
    out: JsonDict = {
        "name": name,
        "image": image,
        "imagePullPolicy": spec.images.pull_policy,
        "command": command,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "env": env,
        "ports": [
            {"name": port_name, "containerPort": port, "protocol": "TCP"}
            for port_name, port in ports
        ],
        "resources": resources(res),
        "securityContext": container_security_context(ipc_lock=res.rdma > 0),
        "volumeMounts": mounts,
    }
    if probes:
        out.update(probes)
    return out
