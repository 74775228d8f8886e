"""The Kubernetes objects a TrainingRun is made of, built from its RunSpec (pure functions).

One call of :func:`build` gives every child of a run, in the order they are applied:

- ``<run>-spec`` ConfigMap: the resolved spec (``spec.yaml``), mounted by every pod;
- ``<run>-trainer`` ServiceAccount, Role and RoleBinding: get/patch of this run's status only;
- ``<run>-checkpoints`` PersistentVolumeClaim when ``storage.size`` is set;
- ``<run>-executor`` Deployment + Service when the spec asks to serve the executor with vLLM;
- ``<run>-rollout`` Deployment + headless Service (GPU resources, gRPC health probes);
- ``<run>-learner`` StatefulSet + headless Service (torchrun ranks, c10d rendezvous on pod 0);
- instead, LeaderWorkerSets for replicas larger than a node (:mod:`aflowrl_operator.groups`):
  one per replica, ``<run>-rollout-<i>`` / ``<run>-executor-<i>``, when ``nodesPerReplica`` is
  above 1, and ``<run>-learner`` as one group when the learner has several nodes;
- ``<run>-env`` Deployment + headless Service + HorizontalPodAutoscaler, the
  ``<run>-env-egress`` NetworkPolicy (DNS and the executor only), and a PodDisruptionBudget
  when ``environment.podDisruptionBudget`` is set;
- ``<run>-ingress`` NetworkPolicy when ``networkPolicy.enabled`` (the run's pods reach each
  other on every port; others only the ports ``networkPolicy`` lists), and ``<run>-egress``
  with ``networkPolicy.namespaceDeniesEgress``;
- ``<run>-trainer`` Job (``aflowrl train``; a failed pod is kept for ``kubectl logs`` and a new
  one resumes from the checkpoint directory);
- ``<run>`` PodMonitor when ``monitoring.serviceMonitor.enabled`` and the API exists;
- ``<run>-gpu`` PodGroup (scheduler-plugins coscheduling) when ``scheduling.gang`` is set: its
  ``minMember`` is every GPU pod, so none binds until all can;
- ``<run>-kueue`` Workload (``kueue.x-k8s.io/v1beta2``, or ``v1beta1``) when the run carries
  the ``kueue.x-k8s.io/queue-name`` label (:func:`kueue_workload`): one pod set per component,
  so Kueue admits the whole run at once or not at all. Until it is admitted the run is held
  (every component at zero, the trainer Job suspended), and its pods get the node labels,
  tolerations and pod set updates of their admission (:mod:`aflowrl_operator.kueue`).

Pods run the entry points of CONTRACTS.md. Workload replica counts are returned apart from the
manifests (:attr:`Child.replicas`) because the HPA owns the environment's count between its
bounds. The workloads themselves are built in :mod:`aflowrl_operator.workloads`;
:mod:`aflowrl_operator.reconcile` applies the result; tests validate it against the Kubernetes
OpenAPI schemas.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from typing import Any

import yaml

from aflowrl.config import API_GROUP, PLURAL, RunSpec, served_executor
from aflowrl_operator import groups, kueue
from aflowrl_operator.names import (
    COMPONENT_LABEL,
    PODSETS_HASH,
    REPLICA_LABEL,
    RUN_LABEL,
    TEMPLATE_HASH,
    RunRef,
    digest,
)
from aflowrl_operator.workloads import (
    environment,
    environment_disruption_budget,
    executor,
    learner,
    rollout,
    run_egress,
    run_ingress,
    trainer,
)

JsonDict = dict[str, Any]

# Fields that only change replica counts, the Job's lifecycle or policies around the pods, not
# what a pod runs: editing
# them must not restart pods.
_SCALING_FIELDS: tuple[tuple[str, ...], ...] = (
    ("suspend",),
    ("environment", "replicas"),
    ("rollout", "replicas"),
    ("environment", "executor", "serve", "replicas"),
    ("trainer", "activeDeadlineSeconds"),
    ("trainer", "keepPodsAfterEnd"),
    ("trainer", "ttlSecondsAfterFinished"),
    ("environment", "podDisruptionBudget"),
    ("networkPolicy",),
)


@dataclasses.dataclass(frozen=True)
class Child:
    """One object to create or patch; ``replicas`` is a workload's desired ``spec.replicas``."""

    manifest: JsonDict
    replicas: int | None = None

    @property
    def kind(self) -> str:
        return str(self.manifest["kind"])

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])


@dataclasses.dataclass(frozen=True)
class Scale:
    """How much of the run should be running.

    ``services``: the rollout, learner, environment and executor run (false when suspended,
    finished, unless ``trainer.keepPodsAfterEnd`` keeps them, or waiting for Kueue).
    ``environment_replicas``: the environment's count (the HPA's, clamped to the spec's
    bounds). ``trainer_suspended``: the trainer Job is suspended. ``placement``: per
    component (Kueue pod set), what its Kueue admission adds to its pods.
    """

    services: bool
    environment_replicas: int
    trainer_suspended: bool
    placement: dict[str, kueue.Placement] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Pruned:
    """Children of one kind found by labels, of which only ``keep`` may exist: the run's
    own others are deleted (the per-replica LeaderWorkerSets beyond the replica count)."""

    kind: str
    labels: dict[str, str]
    keep: frozenset[str]


@dataclasses.dataclass(frozen=True)
class Desired:
    """Every child of a run: objects to apply, the trainer Job, children that must not exist
    (by name), and the sets of children of which only the named ones may exist."""

    children: list[Child]
    trainer_job: JsonDict
    absent: list[tuple[str, str]]
    pruned: list[Pruned] = dataclasses.field(default_factory=list)


def spec_document(spec: RunSpec) -> str:
    """The ``spec.yaml`` pods read: the full resolved spec, camelCase, defaults included."""
    return yaml.safe_dump(spec.to_document(), sort_keys=False, width=100)


def spec_hash(spec: RunSpec) -> str:
    """Hash of everything but replica counts: pod templates carry it, so edits roll the pods."""
    doc = spec.to_document()
    for path in _SCALING_FIELDS:
        node: Any = doc
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return digest(doc)


# ---- small objects ---------------------------------------------------------------------------


def config_map(run: RunRef, spec: RunSpec) -> JsonDict:
    meta = run.metadata(run.config_map, "config")
    meta["annotations"] = {"aflowrl.io/spec-hash": spec_hash(spec)}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {"spec.yaml": spec_document(spec)},
    }


def trainer_rbac(run: RunRef) -> list[JsonDict]:
    """ServiceAccount, Role and RoleBinding: the trainer may get and patch its run's status."""
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": run.metadata(run.trainer, "trainer"),
            "automountServiceAccountToken": False,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": run.metadata(run.trainer, "trainer"),
            "rules": [
                {
                    "apiGroups": [API_GROUP],
                    "resources": [f"{PLURAL}/status"],
                    "resourceNames": [run.name],
                    "verbs": ["get", "patch"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": run.metadata(run.trainer, "trainer"),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": run.trainer,
            },
            "subjects": [{"kind": "ServiceAccount", "name": run.trainer}],
        },
    ]


def checkpoint_claim(run: RunRef, spec: RunSpec) -> JsonDict:
    storage = spec.storage
    claim: JsonDict = {
        "accessModes": [storage.access_mode],
        "resources": {"requests": {"storage": storage.size}},
    }
    if storage.storage_class_name:
        claim["storageClassName"] = storage.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": run.metadata(run.checkpoints, "trainer"),
        "spec": claim,
    }


def pod_monitor(run: RunRef, spec: RunSpec) -> JsonDict:
    """A prometheus-operator PodMonitor scraping every pod's ``metrics`` port."""
    monitor = spec.monitoring.service_monitor
    meta = run.metadata(run.name, "monitoring", extra_labels=dict(monitor.additional_labels))
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {RUN_LABEL: run.name}},
            "podTargetLabels": [RUN_LABEL, COMPONENT_LABEL],
            "podMetricsEndpoints": [
                {"port": "metrics", "path": "/metrics", "interval": monitor.interval}
            ],
        },
    }


def gpu_pods(spec: RunSpec) -> dict[str, int]:
    """Pods per GPU component when the run is running (what a gang must place at once)."""
    counts = {}
    if spec.rollout.resources.gpus:
        counts["rollout"] = spec.rollout.replicas * spec.rollout.nodes_per_replica
    if spec.learner.resources.gpus:
        counts["learner"] = spec.learner.nodes
    serve = served_executor(spec)
    if serve is not None and serve.resources.gpus:
        counts["executor"] = serve.replicas * serve.nodes_per_replica
    return counts


def pod_group(run: RunRef, spec: RunSpec) -> JsonDict:
    """The coscheduling PodGroup of the GPU pods (scheduler-plugins, ``scheduling.gang``)."""
    assert spec.scheduling.gang is not None
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": run.metadata(run.pod_group, "scheduling"),
        "spec": {
            "minMember": sum(gpu_pods(spec).values()),
            "scheduleTimeoutSeconds": spec.scheduling.gang.schedule_timeout_seconds,
        },
    }


def kueue_workload(
    run: RunRef,
    spec: RunSpec,
    desired: Desired,
    *,
    queue: str,
    priority: kueue.Priority | None,
    api_version: str = f"{kueue.GROUP}/{kueue.VERSIONS[0]}",
    max_execution_label: str | None = None,
) -> JsonDict:
    """The run's Kueue Workload: one pod set per component with its pod template (as built
    before admission) and the count it runs with (the environment's autoscaler ceiling),
    admitted all at once, with the run's priority (:func:`kueue.priority_fields`).

    One Workload per run, whatever its children: a component of several LeaderWorkerSets
    (one per multi-node replica) is one pod set of every pod of every group, so Kueue admits
    all the replicas or none. The Workload is created once per shape (what Kueue admits:
    counts, requests and placement, :func:`kueue.admitted_shape`, hashed in
    :data:`PODSETS_HASH`) and replaced only when the shape changes, once no pod runs.
    Its ``maximumExecutionTimeSeconds`` (after which Kueue deactivates it) is the run's
    deadline, ``trainer.activeDeadlineSeconds``, or the run's
    ``kueue.x-k8s.io/max-exec-time-seconds`` label (``max_execution_label``), the shorter.
    """
    max_execution_s = kueue.max_execution_seconds(
        spec.trainer.active_deadline_seconds, max_execution_label
    )
    serve = served_executor(spec)
    counts = {
        "executor": serve.replicas * serve.nodes_per_replica if serve is not None else 0,
        "rollout": spec.rollout.replicas * spec.rollout.nodes_per_replica,
        "learner": spec.learner.nodes,
        "environment": spec.environment.replicas.max,
    }
    pod_sets: list[JsonDict] = []
    for child in desired.children:
        component = child.manifest["metadata"]["labels"].get(COMPONENT_LABEL, "")
        template = groups.pod_template_of(child.manifest)
        if template is None or not counts.get(component):
            continue
        if any(ps["name"] == component for ps in pod_sets):
            continue  # another replica's LeaderWorkerSet: the same pods, counted already
        pod_sets.append({"name": component, "count": counts[component], "template": template})
    pod_sets.append(
        {"name": "trainer", "count": 1, "template": desired.trainer_job["spec"]["template"]}
    )
    for pod_set in pod_sets:
        request = kueue.topology_request(pod_set["template"])
        if request is not None:
            pod_set["topologyRequest"] = request
    meta = run.metadata(run.workload, "scheduling")
    meta["annotations"] = {PODSETS_HASH: digest(kueue.admitted_shape(pod_sets))}
    meta["finalizers"] = [kueue.RESOURCE_IN_USE]
    return {
        "apiVersion": api_version,
        "kind": "Workload",
        "metadata": meta,
        "spec": {
            "queueName": queue,
            "podSets": pod_sets,
            **kueue.priority_fields(api_version, priority),
            **(
                {"maximumExecutionTimeSeconds": max_execution_s}
                if max_execution_s is not None
                else {}
            ),
        },
    }


def build(
    run: RunRef, spec: RunSpec, scale: Scale, *, monitoring_api: bool, group_api: bool = True
) -> Desired:
    """Every child of the run for this spec and scale (see the module docstring).

    ``group_api``: the cluster serves LeaderWorkerSets; without it, groups that need them are
    left out (the reconciler reports ``MultiNodeUnavailable``) and the learner is a
    StatefulSet."""
    spec_digest = spec_hash(spec)
    services = scale.services
    labels = {component: where.node_selector for component, where in scale.placement.items()}
    children: list[Child] = [Child(config_map(run, spec))]
    children += [Child(obj) for obj in trainer_rbac(run)]
    absent: list[tuple[str, str]] = []
    if spec.storage.size is not None:
        children.append(Child(checkpoint_claim(run, spec)))
    serve = served_executor(spec)
    lws = groups.KIND
    pruned: list[Pruned] = []

    def replica_groups(component: str, manifests: list[JsonDict]) -> None:
        """One LeaderWorkerSet per replica (and the component's Service), and no other."""
        sets, service = manifests[:-1], manifests[-1]
        children.extend(Child(group, 1 if services else 0) for group in sets)
        children.append(Child(service))
        names = frozenset(group["metadata"]["name"] for group in sets)
        pruned.append(Pruned(lws, run.selector(component), names))

    if serve is not None and groups.executor_grouped(spec):
        if group_api:
            replica_groups(
                "executor",
                groups.executor(
                    run, spec, spec_hash_=spec_digest, node_labels=labels.get("executor")
                ),
            )
        absent.append(("Deployment", run.executor))
    elif serve is not None:
        deployment, service = executor(
            run, spec, spec_hash_=spec_digest, node_labels=labels.get("executor")
        )
        children += [Child(deployment, serve.replicas if services else 0), Child(service)]
    else:
        absent += [("Deployment", run.executor), ("Service", run.executor)]
    if group_api and not groups.executor_grouped(spec):
        pruned.append(Pruned(lws, run.selector("executor"), frozenset()))
    if groups.rollout_grouped(spec):
        if group_api:
            replica_groups(
                "rollout",
                groups.rollout(
                    run, spec, spec_hash_=spec_digest, node_labels=labels.get("rollout")
                ),
            )
        absent.append(("Deployment", run.rollout))
    else:
        deployment, service = rollout(
            run, spec, spec_hash_=spec_digest, node_labels=labels.get("rollout")
        )
        children += [Child(deployment, spec.rollout.replicas if services else 0), Child(service)]
        if group_api:
            pruned.append(Pruned(lws, run.selector("rollout"), frozenset()))
    # The learner's kind never changes in a run (learner.nodes is immutable).
    if groups.learner_grouped(spec) and group_api:
        group, service = groups.learner(
            run, spec, spec_hash_=spec_digest, node_labels=labels.get("learner")
        )
        # The Service first: the LWS controller creates one of the group's name when it finds
        # none, and the run could then not own it.
        children += [Child(service), Child(group, 1 if services else 0)]
        absent.append(("StatefulSet", run.learner))  # from an operator before groups
    else:
        statefulset, service = learner(
            run, spec, spec_hash_=spec_digest, node_labels=labels.get("learner")
        )
        children += [Child(statefulset, spec.learner.nodes if services else 0), Child(service)]
        if group_api:
            absent.append((lws, run.learner))
    deployment, *others = environment(
        run, spec, spec_hash_=spec_digest, node_labels=labels.get("environment")
    )
    children += [Child(deployment, scale.environment_replicas if services else 0)]
    children += [Child(obj) for obj in others]
    if spec.environment.pod_disruption_budget is not None:
        children.append(Child(environment_disruption_budget(run, spec)))
    else:
        absent.append(("PodDisruptionBudget", run.environment))
    network = spec.network_policy
    if network.enabled:
        children.append(Child(run_ingress(run, spec)))
    else:
        absent.append(("NetworkPolicy", run.ingress))
    if network.enabled and network.namespace_denies_egress:
        children.append(Child(run_egress(run, spec)))
    else:
        absent.append(("NetworkPolicy", run.egress))
    if spec.monitoring.service_monitor.enabled and monitoring_api:
        children.append(Child(pod_monitor(run, spec)))
    elif monitoring_api:
        absent.append(("PodMonitor", run.name))
    if spec.scheduling.gang is not None and gpu_pods(spec):
        children.append(Child(pod_group(run, spec)))
    else:
        absent.append(("PodGroup", run.pod_group))
    job = trainer(
        run,
        spec,
        spec_hash_=spec_digest,
        suspended=scale.trainer_suspended,
        node_labels=labels.get("trainer"),
    )
    if scale.placement:
        for child in children:
            component = child.manifest["metadata"]["labels"].get(COMPONENT_LABEL, "")
            if child.kind in {"Deployment", "StatefulSet"}:
                kueue.place(child.manifest["spec"]["template"], scale.placement.get(component))
            elif child.kind == "LeaderWorkerSet":  # every pod of the group: leader and workers
                roles = child.manifest["spec"]["leaderWorkerTemplate"]
                for role in ("leaderTemplate", "workerTemplate"):
                    if role in roles:
                        kueue.place(roles[role], scale.placement.get(component))
        if "trainer" in scale.placement:
            kueue.place(job["spec"]["template"], scale.placement["trainer"])
            job["metadata"]["annotations"][TEMPLATE_HASH] = digest(job["spec"]["template"])
    exclusive = spec.scheduling.exclusive_topology
    for child in children:
        if child.kind == groups.KIND and exclusive:
            meta = child.manifest["metadata"]
            meta.setdefault("annotations", {})[groups.EXCLUSIVE_TOPOLOGY] = exclusive
    for child in children:
        if child.kind == groups.KIND and REPLICA_LABEL in child.manifest["metadata"]["labels"]:
            groups.stamp(child.manifest)  # its template as placed: replicas take it in turn
    return Desired(children=children, trainer_job=job, absent=absent, pruned=pruned)


def kept_after_end(spec: RunSpec, ended_at: str | None, now: datetime.datetime) -> bool:
    """Whether a finished run's services keep running: ``trainer.keepPodsAfterEnd``, until
    ``trainer.ttlSecondsAfterFinished`` after ``ended_at`` (RFC 3339; unknown: still kept)."""
    trainer = spec.trainer
    if not trainer.keep_pods_after_end:
        return False
    if trainer.ttl_seconds_after_finished is None or not ended_at:
        return True
    try:
        ended = datetime.datetime.fromisoformat(ended_at.replace("Z", "+00:00"))
    except ValueError:
        return True  # an unreadable time keeps the pods: evidence over quota
    if ended.tzinfo is None:
        ended = ended.replace(tzinfo=datetime.UTC)
    return now < ended + datetime.timedelta(seconds=trainer.ttl_seconds_after_finished)


def environment_replicas(spec: RunSpec, live_replicas: int | None) -> int:
    """The environment's count: the autoscaler's, clamped to the spec's bounds (0 -> min)."""
    bounds = spec.environment.replicas
    if not live_replicas:
        return bounds.min
    return min(max(live_replicas, bounds.min), bounds.max)


def full_manifests(
    run: RunRef, spec: RunSpec, scale: Scale, *, monitoring_api: bool, group_api: bool = True
) -> list[JsonDict]:
    """Every manifest as it is created (replica counts filled in): for validation and docs."""
    desired = build(run, spec, scale, monitoring_api=monitoring_api, group_api=group_api)
    out = []
    for child in desired.children:
        manifest = json.loads(json.dumps(child.manifest))
        if child.replicas is not None:
            manifest["spec"]["replicas"] = child.replicas
        out.append(manifest)
    out.append(desired.trainer_job)
    return out
