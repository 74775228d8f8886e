"""The workloads of a TrainingRun: rollout, learner, environment, served executor, trainer.

Pure builders of Deployments, the learner StatefulSet, the trainer Job and their Services, on
the pod building blocks of :mod:`aflowrl_operator.pods`. Pods run the entry points of
CONTRACTS.md: ``aflowrl serve rollout|env``, torchrun ``-m aflowrl serve learner``, ``aflowrl
train``, and vLLM's OpenAI server for a served executor. :mod:`aflowrl_operator.children`
assembles them with the run's other objects.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from aflowrl.config import OpenAIExecutorSpec, ResourceSpec, RunSpec
from aflowrl.config.network import NetworkPeer
from aflowrl.config.scheduling import PodOverrides
from aflowrl_operator import pods
from aflowrl_operator.names import COMPONENT_LABEL, RUN_LABEL, TEMPLATE_HASH, RunRef, digest

JsonDict = dict[str, Any]

EXECUTOR_PORT = 8000
"""Port of the served executor's OpenAI-compatible HTTP API."""
TRAINER_BACKOFF_LIMIT = 10
"""Failed trainer pods before the Job (and the run) fails; each failed pod stays for
``kubectl logs`` until the Job is deleted with the run."""


def executor_base_url(run: RunRef) -> str:
    """``AFLOWRL_EXECUTOR_BASE_URL`` of environment pods when the executor is served in-run."""
    return f"http://{run.executor}.{run.namespace}.svc:{EXECUTOR_PORT}/v1"


def component_service(
    run: RunRef,
    name: str,
    component: str,
    ports: list[tuple[str, int, str | None]],
    *,
    headless: bool,
    publish_not_ready: bool = False,
    only: dict[str, str] | None = None,
) -> JsonDict:
    """A Service of the component's pods (those with the labels ``only`` too, e.g. a group's
    leaders) on the named ports (name, port, appProtocol)."""
    spec: JsonDict = {
        "selector": {**run.selector(component), **(only or {})},
        "ports": [
            {
                "name": port_name,
                "port": port,
                "targetPort": port_name,
                "protocol": "TCP",
                **({"appProtocol": app} if app else {}),
            }
            for port_name, port, app in ports
        ],
    }
    if headless:
        spec["clusterIP"] = "None"
    if publish_not_ready:
        spec["publishNotReadyAddresses"] = True
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": run.metadata(name, component),
        "spec": spec,
    }


def _gpu_strategy(gpus: int) -> JsonDict:
    """GPU workloads roll one pod at a time without surging (no spare GPUs are assumed)."""
    if gpus:
        return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


def _deployment(
    run: RunRef, name: str, component: str, template: JsonDict, strategy: JsonDict
) -> JsonDict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": run.metadata(name, component),
        "spec": {
            "selector": {"matchLabels": run.selector(component)},
            "strategy": strategy,
            "revisionHistoryLimit": 3,
            "template": template,
        },
    }


def _model_mount(spec: RunSpec) -> tuple[list[JsonDict], list[JsonDict]]:
    claim = spec.policy.persistent_volume_claim
    if claim is None:
        return [], []
    volume, mount = pods.models_volume(claim)
    return [volume], [mount]


def _weights_mount(run: RunRef, spec: RunSpec) -> tuple[list[JsonDict], list[JsonDict]]:
    """The checkpoint volume, which also holds the weights of the filesystem transport and the
    nccl transport's fallback exports (``weightTransport.shared_path``)."""
    volume, mount = pods.checkpoint_volume(run, spec)
    return [volume], [mount]


def _grpc_service(
    run: RunRef,
    spec: RunSpec,
    *,
    component: str,
    name: str,
    serve: str,
    image: str,
    res: ResourceSpec,
    port: int,
    env: list[JsonDict],
    volumes: list[JsonDict],
    mounts: list[JsonDict],
    spec_hash_: str,
    overrides: PodOverrides,
    node_labels: dict[str, str] | None,
    ready_service: str = "",
) -> list[JsonDict]:
    """A Deployment of ``aflowrl serve <serve>`` pods + its headless Service (the clients
    resolve every pod and balance over them); readiness reads ``ready_service``'s health
    (:func:`pods.grpc_probes`)."""
    metrics = spec.monitoring.metrics_port
    main = pods.container(
        spec,
        component,
        image,
        command=["aflowrl", "serve", serve, "-f", pods.SPEC_FILE, "--host", "0.0.0.0"],
        res=res,
        env=env,
        mounts=mounts,
        ports=[("grpc", port), ("metrics", metrics)],
        probes=pods.grpc_probes(spec, port, ready_service=ready_service),
    )
    template = pods.pod_template(
        run,
        spec,
        component,
        spec_hash=spec_hash_,
        containers=[main],
        volumes=volumes,
        gpu=res.gpus > 0,
        metrics_port=metrics,
        overrides=overrides,
        admitted_node_labels=node_labels,
    )
    ports: list[tuple[str, int, str | None]] = [
        ("grpc", port, "grpc"),
        ("metrics", metrics, "http"),
    ]
    return [
        _deployment(run, name, component, template, _gpu_strategy(res.gpus)),
        component_service(run, name, component, ports, headless=True),
    ]


def rollout_volumes(run: RunRef, spec: RunSpec) -> tuple[list[JsonDict], list[JsonDict]]:
    """(volumes, mounts) of a rollout pod: the base ones, ``/dev/shm``, the policy's model claim
    and, with the filesystem transport, the weights' volume."""
    volumes, mounts = pods.base_volumes(run, spec)
    shm, shm_mount = pods.shm_volume(spec.rollout.resources)
    model_vols, model_mounts = _model_mount(spec)
    volumes += [shm, *model_vols]
    mounts += [shm_mount, *model_mounts]
    if spec.weight_transport.shared_path is not None:
        # filesystem: the weights; nccl: the fallback exports a replica reloads from when its
        # broadcast broke off, and the newest of which a restarted replica loads on start.
        weight_vols, weight_mounts = _weights_mount(run, spec)
        volumes += weight_vols
        mounts += weight_mounts
    return volumes, mounts


def rollout_env(spec: RunSpec) -> list[JsonDict]:
    """Environment of a rollout container."""
    return pods.base_env(spec) + pods.accelerator_env(
        spec, spec.rollout.resources, engine=spec.rollout.engine
    )


def rollout(
    run: RunRef, spec: RunSpec, *, spec_hash_: str, node_labels: dict[str, str] | None = None
) -> list[JsonDict]:
    """Rollout Deployment + headless Service: ``aflowrl serve rollout``."""
    volumes, mounts = rollout_volumes(run, spec)
    return _grpc_service(
        run,
        spec,
        component="rollout",
        name=run.rollout,
        serve="rollout",
        image=spec.images.torch_image(spec.rollout.resources.gpus),
        res=spec.rollout.resources,
        port=spec.rollout.port,
        env=rollout_env(spec),
        volumes=volumes,
        mounts=mounts,
        spec_hash_=spec_hash_,
        overrides=spec.rollout.pod,
        ready_service=pods.ROLLOUT_SERVICE,
        node_labels=node_labels,
    )


def learner_command(run: RunRef, spec: RunSpec) -> list[str]:
    """torchrun over the StatefulSet's pods; c10d rendezvous on pod 0, which gets rank 0.

    c10d assigns node ranks in the sorted order of the participants' host names, and
    ``<run>-learner-0`` sorts first, so global rank 0 (the gRPC server) runs on pod 0, the
    address the trainer dials.
    """
    ln = spec.learner
    return [
        "torchrun",
        "--nnodes",
        str(ln.nodes),
        "--nproc-per-node",
        str(ln.procs_per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{run.learner_host(0)}:{ln.rendezvous_port}",
        "--rdzv-id",
        run.name,
        "-m",
        "aflowrl",
        "serve",
        "learner",
        "-f",
        pods.SPEC_FILE,
    ]


def learner_template(
    run: RunRef,
    spec: RunSpec,
    *,
    spec_hash_: str,
    node_labels: dict[str, str] | None,
    probed: bool,
    extra_env: list[JsonDict] | None = None,
) -> tuple[JsonDict, list[tuple[str, int]]]:
    """The pod template of a learner node (``probed``: with gRPC health probes, for the pod
    that runs rank 0) and its named ports."""
    ln = spec.learner
    volumes, mounts = pods.base_volumes(run, spec)
    shm, shm_mount = pods.shm_volume(ln.resources)
    model_vols, model_mounts = _model_mount(spec)
    ckpt_vols, ckpt_mounts = _weights_mount(run, spec)
    volumes += [shm, *model_vols, *ckpt_vols]
    mounts += [shm_mount, *model_mounts, *ckpt_mounts]
    metrics = spec.monitoring.metrics_port
    ports = [("grpc", ln.port), ("rendezvous", ln.rendezvous_port), ("metrics", metrics)]
    if spec.weight_transport.type == "nccl":
        ports.append(("weight-sync", spec.weight_transport.port))
    main = pods.container(
        spec,
        "learner",
        spec.images.torch_image(ln.resources.gpus),
        command=learner_command(run, spec),
        res=ln.resources,
        env=pods.base_env(spec) + pods.accelerator_env(spec, ln.resources) + (extra_env or []),
        mounts=mounts,
        ports=ports,
        probes=pods.grpc_probes(spec, ln.port) if probed else None,
    )
    template = pods.pod_template(
        run,
        spec,
        "learner",
        spec_hash=spec_hash_,
        containers=[main],
        volumes=volumes,
        gpu=ln.resources.gpus > 0,
        metrics_port=metrics,
        overrides=ln.pod,
        admitted_node_labels=node_labels,
    )
    return template, ports


def learner_service(run: RunRef, ports: list[tuple[str, int]]) -> JsonDict:
    """The learner's headless Service: every pod, ready or not (the rendezvous host must
    resolve before anything is ready)."""
    service_ports: list[tuple[str, int, str | None]] = [
        (name, port, "grpc" if name == "grpc" else None) for name, port in ports
    ]
    return component_service(
        run, run.learner, "learner", service_ports, headless=True, publish_not_ready=True
    )


def learner(
    run: RunRef, spec: RunSpec, *, spec_hash_: str, node_labels: dict[str, str] | None = None
) -> list[JsonDict]:
    """Learner StatefulSet + headless Service: one pod per node, ``procsPerNode`` ranks each.

    Pods start in parallel (torchrun waits for all nodes) and the Service publishes not-ready
    addresses so the rendezvous host resolves before anything is ready. With one node, rank 0
    serves gRPC and is probed. A learner of several nodes is a LeaderWorkerSet instead
    (:mod:`aflowrl_operator.groups`: one rank's death restarts every rank, every pod probed);
    only on a cluster without that API does it fall back to this StatefulSet, whose pods but
    pod 0 serve nothing and are not probed. Template changes apply when the pods next restart
    (``OnDelete``), so an edit never kills a training step: suspend and resume the run to apply
    one at once.
    """
    template, ports = learner_template(
        run, spec, spec_hash_=spec_hash_, node_labels=node_labels, probed=spec.learner.nodes == 1
    )
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": run.metadata(run.learner, "learner"),
        "spec": {
            "serviceName": run.learner,
            "selector": {"matchLabels": run.selector("learner")},
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "OnDelete"},
            "revisionHistoryLimit": 3,
            "template": template,
        },
    }
    return [statefulset, learner_service(run, ports)]


def _executor_env(run: RunRef, spec: RunSpec) -> list[JsonDict]:
    executor = spec.environment.executor
    env: list[JsonDict] = []
    if isinstance(executor, OpenAIExecutorSpec):
        if executor.serve is not None:
            env.append({"name": "AFLOWRL_EXECUTOR_BASE_URL", "value": executor_base_url(run)})
        if executor.api_key_secret is not None:
            ref = executor.api_key_secret
            env.append(
                {
                    "name": "AFLOWRL_EXECUTOR_API_KEY",
                    "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
                }
            )
    return env


def environment(
    run: RunRef, spec: RunSpec, *, spec_hash_: str, node_labels: dict[str, str] | None = None
) -> list[JsonDict]:
    """Environment Deployment + headless Service + HPA + egress NetworkPolicy."""
    envspec = spec.environment
    volumes, mounts = pods.base_volumes(run, spec)
    env = pods.base_env(spec) + _executor_env(run, spec)
    data = envspec.data
    if data.dir is not None:
        env.append({"name": "AFLOWRL_DATA_DIR", "value": data.dir})
    if data.persistent_volume_claim is not None and data.dir is not None:
        volumes.append(
            {
                "name": "data",
                "persistentVolumeClaim": {
                    "claimName": data.persistent_volume_claim,
                    "readOnly": True,
                },
            }
        )
        mounts.append({"name": "data", "mountPath": data.dir, "readOnly": True})
    deployment, service = _grpc_service(
        run,
        spec,
        component="environment",
        name=run.environment,
        serve="env",
        image=spec.images.image("env"),
        res=envspec.resources,
        port=envspec.port,
        env=env,
        volumes=volumes,
        mounts=mounts,
        spec_hash_=spec_hash_,
        overrides=envspec.pod,
        node_labels=node_labels,
    )
    replicas = envspec.replicas
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": run.metadata(run.environment, "environment"),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": run.environment,
            },
            "minReplicas": replicas.min,
            "maxReplicas": replicas.max,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {
                            "type": "Utilization",
                            "averageUtilization": replicas.target_cpu_utilization,
                        },
                    },
                }
            ],
        },
    }
    return [deployment, service, hpa, environment_egress(run, spec)]


def environment_disruption_budget(run: RunRef, spec: RunSpec) -> JsonDict:
    """The environment's PodDisruptionBudget (``environment.podDisruptionBudget``): drains evict
    at most ``maxUnavailable`` ready pods at once; unready pods may always go."""
    budget = spec.environment.pod_disruption_budget
    assert budget is not None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": run.metadata(run.environment, "environment"),
        "spec": {
            "maxUnavailable": budget.max_unavailable,
            "selector": {"matchLabels": run.selector("environment")},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def environment_egress(run: RunRef, spec: RunSpec) -> JsonDict:
    """Environment pods may reach DNS and the executor, nothing else.

    A served executor is reached by pod selector on its port. An external endpoint is reached
    by its port on any address (a NetworkPolicy cannot name hosts); the surrogate needs no
    egress at all.
    """
    egress: list[JsonDict] = [{"ports": _DNS_PORTS}]
    executor = spec.environment.executor
    if isinstance(executor, OpenAIExecutorSpec):
        if executor.serve is not None:
            egress.append(
                {
                    "to": [{"podSelector": {"matchLabels": run.selector("executor")}}],
                    "ports": [{"protocol": "TCP", "port": EXECUTOR_PORT}],
                }
            )
        elif executor.base_url is not None:
            url = urlsplit(executor.base_url)
            port = url.port or (443 if url.scheme == "https" else 80)
            egress.append(
                {
                    "to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}],
                    "ports": [{"protocol": "TCP", "port": port}],
                }
            )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": run.metadata(run.env_egress, "environment"),
        "spec": {
            "podSelector": {"matchLabels": run.selector("environment")},
            "policyTypes": ["Egress"],
            "egress": egress,
        },
    }


_DNS_PORTS: list[JsonDict] = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
API_SERVER_PORTS = (443, 6443)
"""Ports the API server is reached on (the ``kubernetes`` Service's, and its own behind it)."""


def _peers(listed: list[NetworkPeer]) -> list[JsonDict]:
    out = []
    for peer in listed:
        entry: JsonDict = {"podSelector": {"matchLabels": dict(peer.pod_labels)}}
        if peer.namespace_labels is not None:
            entry["namespaceSelector"] = {"matchLabels": dict(peer.namespace_labels)}
        out.append(entry)
    return out


def run_ingress(run: RunRef, spec: RunSpec) -> JsonDict:
    """Who may connect to the run's pods (``networkPolicy``): the run's own pods on every port
    (NCCL's ephemeral ports, c10d rendezvous, weight sync, gRPC, the served executor), the
    metrics port from ``metricsFrom``, the gRPC ports from ``grpcFrom``; nothing else."""
    policy = spec.network_policy
    run_pods = {"podSelector": {"matchLabels": {RUN_LABEL: run.name}}}
    ingress: list[JsonDict] = [{"from": [run_pods]}]
    if policy.metrics_from:
        ingress.append(
            {
                "from": _peers(policy.metrics_from),
                "ports": [{"protocol": "TCP", "port": spec.monitoring.metrics_port}],
            }
        )
    if policy.grpc_from:
        grpc_ports = sorted({spec.rollout.port, spec.learner.port, spec.environment.port})
        ingress.append(
            {
                "from": _peers(policy.grpc_from),
                "ports": [{"protocol": "TCP", "port": port} for port in grpc_ports],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": run.metadata(run.ingress, "network"),
        "spec": {
            "podSelector": {"matchLabels": {RUN_LABEL: run.name}},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def run_egress(run: RunRef, spec: RunSpec) -> JsonDict:
    """Egress of the run's pods but the environment's (which keep :func:`environment_egress`),
    for a namespace that denies egress by default (``networkPolicy.namespaceDeniesEgress``):
    the run's pods on every port, DNS, and the API server (the trainer writes the run's status;
    a NetworkPolicy cannot name the API server, so its ports are open at any address)."""
    anywhere = [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": run.metadata(run.egress, "network"),
        "spec": {
            "podSelector": {
                "matchLabels": {RUN_LABEL: run.name},
                "matchExpressions": [
                    {"key": COMPONENT_LABEL, "operator": "NotIn", "values": ["environment"]}
                ],
            },
            "policyTypes": ["Egress"],
            "egress": [
                {"to": [{"podSelector": {"matchLabels": {RUN_LABEL: run.name}}}]},
                {"ports": _DNS_PORTS},
                {
                    "to": anywhere,
                    "ports": [{"protocol": "TCP", "port": port} for port in API_SERVER_PORTS],
                },
            ],
        },
    }


def executor_template(
    run: RunRef,
    spec: RunSpec,
    *,
    spec_hash_: str,
    node_labels: dict[str, str] | None,
    command: list[str],
    probed: bool,
    extra_env: list[JsonDict] | None = None,
) -> JsonDict:
    """The pod template of a served-executor pod running ``command`` (``probed``: the pod
    serving the HTTP API, probed on ``/health``)."""
    exe = spec.environment.executor
    assert isinstance(exe, OpenAIExecutorSpec) and exe.serve is not None
    serve = exe.serve
    tmp = {"name": "tmp", "emptyDir": {}}
    shm, shm_mount = pods.shm_volume(serve.resources)
    volumes: list[JsonDict] = [tmp, shm]
    mounts: list[JsonDict] = [{"name": "tmp", "mountPath": "/tmp"}, shm_mount]
    if serve.persistent_volume_claim is not None:
        volume, mount = pods.models_volume(serve.persistent_volume_claim)
        volumes.append(volume)
        mounts.append(mount)
    http_probe = {"httpGet": {"path": "/health", "port": "http"}, "timeoutSeconds": 5}
    main = pods.container(
        spec,
        "vllm",
        serve.image,
        command=command,
        res=serve.resources,
        env=[
            {"name": "HOME", "value": "/tmp"},
            {"name": "XDG_CACHE_HOME", "value": "/tmp/.cache"},
            {"name": "HF_HOME", "value": "/tmp/hf"},
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            *(extra_env or []),
        ],
        mounts=mounts,
        ports=[("http", EXECUTOR_PORT)] if probed else [],
        probes={
            "startupProbe": {**http_probe, "periodSeconds": 10, "failureThreshold": 180},
            "readinessProbe": {**http_probe, "periodSeconds": 10, "failureThreshold": 3},
            "livenessProbe": {**http_probe, "periodSeconds": 20, "failureThreshold": 6},
        }
        if probed
        else None,
    )
    return pods.pod_template(
        run,
        spec,
        "executor",
        spec_hash=spec_hash_,
        containers=[main],
        volumes=volumes,
        gpu=serve.resources.gpus > 0,
        metrics_port=None,
        admitted_node_labels=node_labels,
    )


def executor_args(spec: RunSpec) -> list[str]:
    """Arguments of vLLM's server for the served executor (model, name, port, parallelism)."""
    exe = spec.environment.executor
    assert isinstance(exe, OpenAIExecutorSpec) and exe.serve is not None
    serve = exe.serve
    return [
        "--model",
        serve.model,
        "--served-model-name",
        exe.model,
        "--host",
        "0.0.0.0",
        "--port",
        str(EXECUTOR_PORT),
        "--tensor-parallel-size",
        str(serve.tensor_parallel_size),
        "--pipeline-parallel-size",
        str(serve.pipeline_parallel_size),
        *serve.extra_args,
    ]


VLLM_SERVER = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
"""vLLM's OpenAI-compatible server (the image's ``vllm`` console script may be missing)."""


def executor_service(run: RunRef, *, leaders_only: dict[str, str] | None = None) -> JsonDict:
    """The served executor's ClusterIP Service on port 8000 (of group leaders only, when
    ``leaders_only`` names the label that marks them)."""
    ports: list[tuple[str, int, str | None]] = [("http", EXECUTOR_PORT, "http")]
    return component_service(
        run, run.executor, "executor", ports, headless=False, only=leaders_only
    )


def executor(
    run: RunRef, spec: RunSpec, *, spec_hash_: str, node_labels: dict[str, str] | None = None
) -> list[JsonDict]:
    """The served executor: vLLM's OpenAI-compatible server Deployment + Service on port 8000."""
    exe = spec.environment.executor
    assert isinstance(exe, OpenAIExecutorSpec) and exe.serve is not None
    template = executor_template(
        run,
        spec,
        spec_hash_=spec_hash_,
        node_labels=node_labels,
        command=[*VLLM_SERVER, *executor_args(spec)],
        probed=True,
    )
    strategy = _gpu_strategy(exe.serve.resources.gpus)
    return [
        _deployment(run, run.executor, "executor", template, strategy),
        executor_service(run),
    ]


def trainer_command(run: RunRef, spec: RunSpec) -> list[str]:
    """``aflowrl train`` against the run's three services (CONTRACTS.md)."""
    return [
        "aflowrl",
        "train",
        "-f",
        pods.SPEC_FILE,
        "--env",
        run.grpc_target(run.environment, spec.environment.port),
        "--rollout",
        run.grpc_target(run.rollout, spec.rollout.port),
        "--learner",
        f"dns:///{run.learner_host(0)}:{spec.learner.port}",
        "--run-dir",
        spec.trainer.checkpoint_dir,
    ]


def trainer(
    run: RunRef,
    spec: RunSpec,
    *,
    spec_hash_: str,
    suspended: bool,
    node_labels: dict[str, str] | None = None,
) -> JsonDict:
    """The trainer Job. A failed trainer pod is kept and the Job starts a new one
    (``restartPolicy: Never``, up to :data:`TRAINER_BACKOFF_LIMIT` failures), so every failed
    attempt's log stays readable with ``kubectl logs``; the new pod resumes from the last
    checkpoint on the run's claim (``storage.size``; with an emptyDir it starts over).
    ``trainer.activeDeadlineSeconds`` bounds how long the Job may run."""
    volumes, mounts = pods.base_volumes(run, spec)
    model_vols, model_mounts = _model_mount(spec)
    ckpt_vols, ckpt_mounts = _weights_mount(run, spec)
    volumes += [*model_vols, *ckpt_vols]
    mounts += [*model_mounts, *ckpt_mounts]
    env = [
        *pods.base_env(spec),
        {"name": "AFLOWRL_RUN_NAME", "value": run.name},
        {"name": "AFLOWRL_RUN_NAMESPACE", "value": run.namespace},
    ]
    wandb_key = spec.monitoring.wandb.api_key_secret
    if "wandb" in spec.monitoring.loggers and wandb_key is not None:
        ref = {"name": wandb_key.name, "key": wandb_key.key}
        env.append({"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": ref}})
    metrics = spec.monitoring.metrics_port
    main = pods.container(
        spec,
        "trainer",
        spec.images.image("env"),
        command=trainer_command(run, spec),
        res=spec.trainer.resources,
        env=env,
        mounts=mounts,
        ports=[("metrics", metrics)],
    )
    template = pods.pod_template(
        run,
        spec,
        "trainer",
        spec_hash=spec_hash_,
        containers=[main],
        volumes=volumes,
        gpu=False,
        metrics_port=metrics,
        overrides=spec.trainer.pod,
        admitted_node_labels=node_labels,
        service_account=run.trainer,
        restart_policy="Never",
    )
    meta = run.metadata(run.trainer, "trainer")
    meta["annotations"] = {TEMPLATE_HASH: digest(template)}
    job: JsonDict = {
        "suspend": suspended,
        "backoffLimit": TRAINER_BACKOFF_LIMIT,
        "template": template,
    }
    if spec.trainer.active_deadline_seconds is not None:
        job["activeDeadlineSeconds"] = spec.trainer.active_deadline_seconds
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job}
