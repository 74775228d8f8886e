"""How Kueue's built-in integrations see a run's children (and the pods their controllers make).

Kueue's own predicates, written here from its source (kubernetes-sigs/kueue):

- ``FindAncestorJobManagedByKueue`` (``pkg/controller/jobframework/reconciler.go``): walk the
  controller owner references up while the owner's kind is known (a registered integration,
  an ``integrations.externalFrameworks`` entry, or ``apps/v1`` ReplicaSet); the top-most owner
  that is managed (an enabled integration or an external framework) and has a queue name (or
  with ``manageJobsWithoutQueueName``) is the ancestor.
- ``WorkloadShouldBeSuspended`` (``jobframework/utils.go``), called by the Deployment,
  StatefulSet and LeaderWorkerSet webhooks and, per pod, by the Pod webhook: an object with
  such an ancestor is never suspended, gated, or given a Workload of its own.
- ``defaultLocalQueueApplies`` (``jobframework/defaults.go``): the ``default`` LocalQueue is
  never put on an object whose controller owner is managed (``IsOwnerManagedByKueueForObject``).
- The Job reconciler (``ReconcileGenericJob``): a Job with such an ancestor is a child job, only
  kept suspended while the ancestor's Workload is not admitted (``shouldSuspendChildJob``),
  which is what the operator does too.

So the run's children are left alone exactly when ``TrainingRun.v1alpha1.aflowrl.io`` is in
``externalFrameworks`` and Kueue can read the run (the chart's ``kueue.controllerAccess``).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from aflowrl.config import RunSpec
from aflowrl_operator import children
from aflowrl_operator.names import RunRef

RUN = RunRef(name="demo", namespace="team-a", uid="run-uid")
RUNNING = children.Scale(services=True, environment_replicas=2, trainer_suspended=False)
REGISTERED = {
    ("batch/v1", "Job"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "StatefulSet"),
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"),
    ("v1", "Pod"),
}
"""Kueue's integrations whose kinds a run's children and their pods are (registered always)."""
TRAINING_RUN = ("aflowrl.io/v1alpha1", "TrainingRun")
QUEUE = {"kueue.x-k8s.io/queue-name": "team-a"}

Objects = dict[str, dict[str, Any]]


def _controller(obj: dict[str, Any]) -> dict[str, Any] | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r for r in refs if r.get("controller")), None)


def _known(ref: dict[str, Any], external: set[tuple[str, str]]) -> bool:
    kind = (ref["apiVersion"], ref["kind"])
    return kind in REGISTERED or kind in external or kind == ("apps/v1", "ReplicaSet")


def _managed(ref: dict[str, Any], enabled: set[tuple[str, str]], external: set) -> bool:
    kind = (ref["apiVersion"], ref["kind"])
    return kind in enabled or kind in external


def find_ancestor(
    obj: dict[str, Any],
    objects: Objects,
    *,
    enabled: set[tuple[str, str]],
    external: set[tuple[str, str]],
    manage_without_queue_name: bool = False,
) -> dict[str, Any] | None:
    """Kueue's ``FindAncestorJobManagedByKueue``."""
    top = None
    current = obj
    seen = {obj["metadata"]["uid"]}
    while (owner := _controller(current)) is not None and _known(owner, external):
        assert owner["uid"] not in seen, "cyclic ownership"  # Kueue's ErrCyclicOwnership
        seen.add(owner["uid"])
        parent = objects[owner["uid"]]
        queued = bool((parent["metadata"].get("labels") or {}).get(QUEUE_LABEL))
        if _managed(owner, enabled, external) and (manage_without_queue_name or queued):
            top = parent
        current = parent
    return top


QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def default_local_queue_applies(obj: dict[str, Any], *, enabled: set, external: set) -> bool:
    """Kueue's ``defaultLocalQueueApplies`` (a ``default`` LocalQueue exists)."""
    if (obj["metadata"].get("labels") or {}).get(QUEUE_LABEL):
        return False
    owner = _controller(obj)
    return not (owner is not None and _managed(owner, enabled, external))


def _owned(kind: tuple[str, str], name: str, owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": kind[0],
        "kind": kind[1],
        "metadata": {
            "name": name,
            "uid": f"{name}-{kind[1]}-uid",
            "labels": {},
            "ownerReferences": [
                {
                    "apiVersion": owner["apiVersion"],
                    "kind": owner["kind"],
                    "name": owner["metadata"]["name"],
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
    }


def _cluster(spec: RunSpec) -> tuple[Objects, list[dict[str, Any]]]:
    """The run, its workload children as built, and what their controllers create: a
    Deployment's ReplicaSet and pod, a StatefulSet's pod, a Job's pod, and a
    LeaderWorkerSet's leader StatefulSet, leader pod, worker StatefulSet (owned by the leader
    pod, as the LWS controller makes it) and worker pod. Returns every object by uid and the
    objects Kueue's integrations look at."""
    run = {
        "apiVersion": TRAINING_RUN[0],
        "kind": TRAINING_RUN[1],
        "metadata": {"name": RUN.name, "uid": RUN.uid, "labels": dict(QUEUE)},
    }
    desired = children.build(RUN, spec, RUNNING, monitoring_api=False)
    built = [c.manifest for c in desired.children] + [desired.trainer_job]
    looked_at: list[dict[str, Any]] = []
    for manifest in built:
        kind = (manifest["apiVersion"], manifest["kind"])
        if kind not in REGISTERED:
            continue
        child = copy.deepcopy(manifest)
        child["metadata"]["uid"] = f"{child['metadata']['name']}-{child['kind']}-uid"
        looked_at.append(child)
        name = child["metadata"]["name"]
        if kind == ("apps/v1", "Deployment"):
            replica_set = _owned(("apps/v1", "ReplicaSet"), f"{name}-rs", child)
            looked_at += [replica_set, _owned(("v1", "Pod"), f"{name}-rs-pod", replica_set)]
        elif kind in {("apps/v1", "StatefulSet"), ("batch/v1", "Job")}:
            looked_at.append(_owned(("v1", "Pod"), f"{name}-0", child))
        else:
            leaders = _owned(("apps/v1", "StatefulSet"), name, child)
            leader = _owned(("v1", "Pod"), f"{name}-0", leaders)
            workers = _owned(("apps/v1", "StatefulSet"), f"{name}-0", leader)
            looked_at += [leaders, leader, workers, _owned(("v1", "Pod"), f"{name}-0-1", workers)]
    objects = {o["metadata"]["uid"]: o for o in [run, *looked_at]}
    return objects, looked_at


SPEC = RunSpec.from_document(
    {
        "learner": {"nodes": 2, "procsPerNode": 8, "resources": {"gpus": 8}},
        "environment": {
            "executor": {
                "type": "openai",
                "model": "exec",
                "serve": {"model": "/models/exec", "nodesPerReplica": 2, "resources": {"gpus": 8}},
            }
        },
    }
)
"""A run with every kind of child: Deployments (rollout, environment), LeaderWorkerSets (the
learner, the served executor's replicas) and the trainer Job."""


@pytest.mark.parametrize("integration", sorted(REGISTERED))
def test_with_trainingrun_an_external_framework_every_integration_leaves_the_children_alone(
    integration: tuple[str, str],
):
    objects, looked_at = _cluster(SPEC)
    kinds = {(o["apiVersion"], o["kind"]) for o in looked_at}
    assert integration in kinds  # the run has children (or pods) of this integration's kind
    for obj in looked_at:
        if (obj["apiVersion"], obj["kind"]) != integration:
            continue
        ancestor = find_ancestor(obj, objects, enabled=REGISTERED, external={TRAINING_RUN})
        where = f"{obj['kind']} {obj['metadata']['name']}"
        assert ancestor is not None and ancestor["kind"] == "TrainingRun", where
        # Hence no suspension, scheduling gate or Workload of its own, and no default queue
        # (the Pod webhook never defaults a queue: only the job-like webhooks do).
        if obj["kind"] != "Pod":
            assert not default_local_queue_applies(
                obj, enabled=REGISTERED, external={TRAINING_RUN}
            ), where


def test_without_the_external_framework_kueue_would_manage_the_children_itself():
    """The control: Kueue without ``externalFrameworks`` queues the run's Deployments,
    StatefulSets, LeaderWorkerSets and Job on their own (each is then a top-level job a
    ``default`` LocalQueue would be put on), which is why the set-up needs it."""
    objects, looked_at = _cluster(SPEC)
    tops = [
        o
        for o in looked_at
        if _controller(o)["kind"] == "TrainingRun"  # type: ignore[index]
        and find_ancestor(o, objects, enabled=REGISTERED, external=set()) is None
    ]
    assert {o["kind"] for o in tops} >= {"Deployment", "LeaderWorkerSet", "Job"}
    assert all(default_local_queue_applies(o, enabled=REGISTERED, external=set()) for o in tops)


def test_every_child_kueue_looks_at_is_controlled_by_the_run():
    _, looked_at = _cluster(SPEC)
    for obj in looked_at:
        owner = _controller(obj)
        assert owner is not None, obj["metadata"]["name"]


def test_multi_node_groups_take_a_topology_domain_each_when_asked():
    exclusive = SPEC.model_copy(
        update={
            "scheduling": SPEC.scheduling.model_copy(
                update={"exclusive_topology": "nvidia.com/gpu.clique"}
            )
        }
    )
    for spec, wanted in ((SPEC, None), (exclusive, "nvidia.com/gpu.clique")):
        desired = children.build(RUN, spec, RUNNING, monitoring_api=False)
        sets = [c.manifest for c in desired.children if c.kind == "LeaderWorkerSet"]
        assert sets
        for lws in sets:
            annotations = lws["metadata"].get("annotations") or {}
            assert annotations.get("leaderworkerset.sigs.k8s.io/exclusive-topology") == wanted
