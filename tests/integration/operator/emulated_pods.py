"""Pods and the status their controllers write, as pure functions, for the emulated API server.

No kubelet or controller runs in the emulator: tests play them through the emulator's named
helpers (:meth:`kube_emulator.KubeEmulator.start_pods`, ``set_pod_ready``, ``terminate_pod``,
``finish_termination``, ``play_controller``, ``start_lws_group``), which build pods here and
recompute their owner's status here, with the real controllers' counting rules:

- a pod can run without being ready (phase ``Running``, condition ``Ready`` False: a vLLM
  replica in its startup probe); a terminating pod (``metadata.deletionTimestamp`` set) is still
  there, and still holds its node's resources, until its grace period ends;
- Deployment (its ReplicaSets' counts): ``replicas`` and ``readyReplicas`` /
  ``availableReplicas`` count non-terminating pods only (the ReplicaSet controller's
  ``FilterActivePods``), ``terminatingReplicas`` the terminating ones (Kubernetes 1.33+);
- StatefulSet: ``replicas`` counts every pod it created, terminating ones included; ready and
  available replicas are running, ready and not terminating;
- Job: ``active`` is pending or running pods not terminating, ``ready`` the ready ones among
  them, ``terminating`` the terminating ones (``JobPodReplacementPolicy``, on by default since
  1.29; Kueue's Job integration treats a Job with terminating pods as still active when quota
  is held until pods are gone);
- LeaderWorkerSet: ``replicas`` counts groups with a pod, ``readyReplicas`` groups whose every
  pod (leader and workers) is running, ready and not terminating: one unready worker makes its
  group unready.
"""

from __future__ import annotations

import copy
from typing import Any

JsonDict = dict[str, Any]

LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"


def terminating(pod: JsonDict) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def ready(pod: JsonDict) -> bool:
    """Running and Ready (and not terminating: the kubelet marks a terminating pod unready)."""
    status = pod.get("status") or {}
    conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    return status.get("phase") == "Running" and conds.get("Ready") == "True"


def finished(pod: JsonDict) -> bool:
    return (pod.get("status") or {}).get("phase") in {"Succeeded", "Failed"}


def pod_status(*, is_ready: bool, phase: str = "Running") -> JsonDict:
    """A pod's status as the kubelet writes it: running and ready, or running and not ready
    (a readiness or startup probe failing)."""
    flag = "True" if is_ready and phase == "Running" else "False"
    running = phase == "Running"
    return {
        "phase": phase,
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": flag},
            {"type": "Ready", "status": flag},
        ],
        "containerStatuses": [
            {
                "name": "main",
                "ready": flag == "True",
                "started": running,
                "restartCount": 0,
                "state": {"running": {}}
                if running
                else {"waiting": {"reason": "ContainerCreating"}},
            }
        ],
    }


def pod_template(owner: JsonDict, *, worker: bool = False) -> JsonDict:
    """The pod template of a workload (a LeaderWorkerSet's leader or worker template)."""
    spec = owner.get("spec") or {}
    if owner.get("kind") == "LeaderWorkerSet":
        lwt = spec.get("leaderWorkerTemplate") or {}
        template = lwt.get("workerTemplate") or {}
        if not worker and lwt.get("leaderTemplate"):
            template = lwt["leaderTemplate"]
        return template
    return spec.get("template") or {}


def make_pod(
    owner: JsonDict,
    name: str,
    *,
    is_ready: bool,
    node: str | None,
    labels: dict[str, str] | None = None,
    worker: bool = False,
) -> JsonDict:
    """A pod of ``owner`` (labels and spec from its template), owned by it, bound to ``node``."""
    template = copy.deepcopy(pod_template(owner, worker=worker))
    meta = owner["metadata"]
    spec = template.get("spec") or {"containers": [{"name": "main", "image": "emulated"}]}
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": meta.get("namespace"),
            "labels": {**((template.get("metadata") or {}).get("labels") or {}), **(labels or {})},
            "ownerReferences": [
                {
                    "apiVersion": owner["apiVersion"],
                    "kind": owner["kind"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
        "status": pod_status(is_ready=is_ready),
    }


def owned_by(pod: JsonDict, owner: JsonDict) -> bool:
    uid = owner["metadata"].get("uid")
    return any(ref.get("uid") == uid for ref in pod["metadata"].get("ownerReferences") or [])


def desired_pods(owner: JsonDict) -> int:
    """How many pods the owner's controller keeps (a suspended Job: none)."""
    spec = owner.get("spec") or {}
    kind = owner.get("kind")
    if kind == "Job":
        if spec.get("suspend"):
            return 0
        parallelism = int(spec.get("parallelism", 1))
        completions = spec.get("completions")
        return min(parallelism, int(completions)) if completions is not None else parallelism
    if kind == "LeaderWorkerSet":
        size = int((spec.get("leaderWorkerTemplate") or {}).get("size", 1))
        return int(spec.get("replicas", 1)) * size
    return int(spec.get("replicas", 1))


def owner_status(owner: JsonDict, pods: list[JsonDict]) -> JsonDict:
    """The owner's status fields its controller computes from its pods (merged over the
    status it has: conditions and other fields are kept)."""
    kind = owner.get("kind")
    live = [p for p in pods if not terminating(p)]
    dying = [p for p in pods if terminating(p)]
    live_ready = sum(1 for p in live if ready(p))
    counts: JsonDict
    if kind == "Deployment":
        counts = {
            "replicas": len(live),
            "updatedReplicas": len(live),
            "readyReplicas": live_ready,
            "availableReplicas": live_ready,
            "unavailableReplicas": max(desired_pods(owner) - live_ready, 0),
            "terminatingReplicas": len(dying),
        }
    elif kind == "StatefulSet":
        counts = {
            "replicas": len(pods),
            "currentReplicas": len(pods),
            "updatedReplicas": len(pods),
            "readyReplicas": live_ready,
            "availableReplicas": live_ready,
        }
    elif kind == "Job":
        active = [p for p in live if not finished(p)]
        counts = {
            "active": len(active),
            "ready": sum(1 for p in active if ready(p)),
            "terminating": len([p for p in dying if not finished(p)]),
        }
    elif kind == "LeaderWorkerSet":
        groups: dict[str, list[JsonDict]] = {}
        for pod in pods:
            groups.setdefault(pod["metadata"]["labels"].get(LWS_GROUP, "0"), []).append(pod)
        size = int(((owner.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("size", 1))
        ready_groups = sum(
            1
            for members in groups.values()
            if len(members) >= size and all(ready(p) and not terminating(p) for p in members)
        )
        counts = {
            "replicas": len(groups),
            "updatedReplicas": len(groups),
            "readyReplicas": ready_groups,
        }
    else:
        raise ValueError(f"no controller emulated for {kind}")
    return {**copy.deepcopy(owner.get("status") or {}), **counts}
