"""Kueue admission of a run, read from and reported to its Workload (pure functions).

A TrainingRun labelled ``kueue.x-k8s.io/queue-name: <LocalQueue>`` is a suspendable job to
Kueue, integrated the way Kueue's own job integrations are (its ``jobframework`` reconciler):
the operator creates one ``Workload`` for the run (``kueue.x-k8s.io/v1beta2``, else
``v1beta1`` where the cluster serves only that), owned by the run, with one pod set per
component (:func:`aflowrl_operator.children.kueue_workload`), so Kueue admits the whole run
(rollout, learner, environment, trainer and a served executor) at once or not at all, with its
quota, preemption and fair sharing. The Workload is created once and kept for the run's life:

- until it is admitted the run is held (every component at zero, the trainer Job suspended)
  and its ``spec.suspend`` is true, written by the operator as Kueue's job integration with the
  :data:`RUN_SUSPENDED_BY` marker (:func:`suspend_patch`; the chart's optional
  MutatingAdmissionPolicy sets both at creation, as Kueue's defaulting webhooks do): a queued
  run is created suspended and starts on admission (``spec.suspend`` false again), with the
  admitted flavors' node labels and tolerations and any admission check's ``podSetUpdates`` on
  each pod set's pods (:func:`placement`, :func:`place`);
- on eviction (``Evicted``) the run is held (and marked suspended) again; once none of its pods
  runs, the operator gives the quota back exactly as Kueue's job reconciler does
  (:func:`release`: ``Requeued``, ``QuotaReserved`` false, ``status.admission`` cleared), and
  Kueue requeues and readmits the same Workload (its backoff, ``requeueState`` and ``active``
  kept);
- ``spec.active: false`` (Kueue's backoff limit, maximum execution time, or an administrator)
  keeps the run held and is reported; the operator never turns it back on, except where it
  turned it off itself for a user's ``spec.suspend`` (one without the marker;
  :data:`SUSPENDED_BY`), which the operator never turns off;
- ``PodsReady`` is kept on the Workload's status (:func:`pods_ready`) for ``waitForPodsReady``;
- a finished run marks its Workload ``Finished`` (:func:`finished`), which releases the quota.

Kueue-managed namespaces that set ``manageJobsWithoutQueueName`` must list
``TrainingRun.v1alpha1.aflowrl.io`` in Kueue's ``integrations.externalFrameworks``, so the run's
own Job (owned by the run) is not queued a second time (README).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

JsonDict = dict[str, Any]

GROUP = "kueue.x-k8s.io"
VERSIONS = ("v1beta2", "v1beta1")
"""Workload API versions the operator speaks, preferred first."""
SUSPENDED_BY = "aflowrl.io/deactivated-for-suspend"
"""Workload annotation: the operator set ``spec.active: false`` for the run's ``spec.suspend``
(so it turns it back on when the run resumes; a deactivation by Kueue is never undone)."""
RUN_SUSPENDED_BY = "aflowrl.io/suspended-by"
"""TrainingRun annotation, value :data:`RUN_SUSPENDED_BY_KUEUE`: the run's ``spec.suspend: true``
was written by the operator acting as Kueue's job integration (the run is queued or evicted),
not by the user; the operator sets it false again on admission. A ``spec.suspend: true``
without it is the user's, which the operator never turns off."""
RUN_SUSPENDED_BY_KUEUE = "kueue"
WORKLOAD_PRIORITY_CLASS = "WorkloadPriorityClass"
PRIORITY_CLASS = "PriorityClass"
RESOURCE_IN_USE = f"{GROUP}/resource-in-use"
"""Finalizer on the run's Workload while any pod of the run may still hold the resources
Kueue admitted (Kueue's ``ResourceInUseFinalizerName``, which its ``jobframework`` puts on the
Workloads of its own jobs at creation): the Workload, and with it the quota, outlives a
deletion (the run's, or the operator's on a reshape) until every pod of the run is gone."""
_FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
_REQUEUED_REASONS = frozenset({"Preempted", "NodeFailures"})
"""Eviction reasons after which Kueue's job reconciler marks the Workload ``Requeued`` True at
once (the others, such as ``PodsReadyTimeout``, are requeued by Kueue after its backoff)."""


@dataclasses.dataclass(frozen=True)
class Admission:
    """What Kueue decided about a run's Workload.

    ``admitted``: admitted and not evicted; ``evicted``: Kueue evicts it (``reason``, its
    ``message``); ``reserved``: it holds quota (``status.admission`` set); ``active``: its
    ``spec.active``; ``flavors``: per pod set, resource -> ResourceFlavor; ``updates``: per
    pod set, the ``podSetUpdates`` of its admission checks; ``message``: Kueue's last word.
    """

    exists: bool = False
    uid: str = ""
    admitted: bool = False
    evicted: bool = False
    reserved: bool = False
    active: bool = True
    finished: bool = False
    reason: str = ""
    message: str = ""
    flavors: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    updates: dict[str, list[JsonDict]] = dataclasses.field(default_factory=dict)
    name: str = ""
    topology: frozenset[str] = frozenset()
    """Pod sets admitted with a ``topologyAssignment`` (topology-aware scheduling)."""
    checks: tuple[str, ...] = ()
    """Admission checks of the Workload (their names, to look their controllers up)."""


@dataclasses.dataclass(frozen=True)
class Placement:
    """What admission adds to one pod set's pods (as Kueue does to its own jobs' pods)."""

    node_selector: dict[str, str] = dataclasses.field(default_factory=dict)
    tolerations: list[JsonDict] = dataclasses.field(default_factory=list)
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    annotations: dict[str, str] = dataclasses.field(default_factory=dict)
    scheduling_gates: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Priority:
    """A run's priority: the class it names (``kind`` WorkloadPriorityClass or PriorityClass)
    and that class's value (None when the class does not exist)."""

    name: str
    kind: str
    value: int | None


QUEUE_LABEL = f"{GROUP}/queue-name"
DEFAULT_LOCAL_QUEUE = "default"
"""The LocalQueue Kueue defaults a job's queue to when the namespace has one of this name and
the job names none (Kueue's ``LocalQueueDefaulting``, ``jobframework.ApplyDefaultLocalQueue``)."""
QUEUE_IMMUTABLE = "QueueNameImmutable"
LOCAL_QUEUE_MISSING = "LocalQueueMissing"
PLACEMENT_FAILED = "PlacementFailed"


@dataclasses.dataclass(frozen=True)
class Queueing:
    """Which LocalQueue a run is under in this pass, as Kueue's job integrations decide it.

    ``queue``: the queue (None: the run is not under Kueue); ``refused``: why a change of the
    run's ``kueue.x-k8s.io/queue-name`` label is not acted on (the run stays under
    ``queue``); ``label_default``: the operator labels the run with the namespace's
    ``default`` LocalQueue; ``unqueued``: the run names no queue and the operator manages
    runs without one (``manageJobsWithoutQueueName``): held until it names one.
    """

    queue: str | None
    refused: str = ""
    label_default: bool = False
    unqueued: bool = False


def queueing(
    label: str | None,
    workload: JsonDict | None,
    *,
    in_use: bool,
    default_queue: bool,
    manage_without_queue_name: bool,
) -> Queueing:
    """Decide a run's queue from its label and its live Workload.

    Kueue keeps a job's queue name immutable while the job runs (its webhook's
    ``validateUpdateForQueueName``), so the quota it admitted cannot be escaped by relabelling.
    The run's own rule is stricter, because a run's ``spec.suspend`` is also written while it
    is evicted but still holds quota: while the Workload holds quota or any pod of the run
    exists (``in_use``), a label that differs from the Workload's ``spec.queueName`` (removed
    or changed) is refused and the run stays under the Workload's queue. Otherwise the label
    wins (the Workload follows it while it holds no quota, as Kueue's ``QueueNameChange``).
    A run without the label gets the namespace's ``default`` LocalQueue when that exists
    (``default_queue``), and with ``manage_without_queue_name`` it is held until it names one.
    """
    live = workload is not None and not _true(workload, "Finished")
    bound = str(((workload or {}).get("spec") or {}).get("queueName") or "") if live else ""
    label = label or None
    if live and in_use and bound and label != bound:
        said = f"changed to {label!r}" if label else "removed"
        return Queueing(
            queue=bound,
            refused=f"the {QUEUE_LABEL} label was {said} while the run holds quota or runs on "
            f"LocalQueue {bound!r}: the queue of a running run is immutable, so the run stays "
            f"on {bound!r}; restore the label, or suspend the run and change it once its pods "
            "are gone",
        )
    if label is not None:
        return Queueing(queue=label)
    if default_queue:
        return Queueing(queue=DEFAULT_LOCAL_QUEUE, label_default=True)
    if manage_without_queue_name:
        return Queueing(queue=None, unqueued=True)
    return Queueing(queue=None)


PODSET_LABEL = f"{GROUP}/podset"
WORKLOAD_ANNOTATION = f"{GROUP}/workload"
TOPOLOGY_GATE = f"{GROUP}/topology"
MULTIKUEUE_CONTROLLER = f"{GROUP}/multikueue"
"""``controllerName`` of MultiKueue's AdmissionCheck: it dispatches a Workload to a worker
cluster through an adapter of the job's kind, and there is none for TrainingRuns."""
MULTIKUEUE_UNSUPPORTED = "MultiKueueUnsupported"
_TOPOLOGY_ANNOTATIONS = {
    f"{GROUP}/podset-required-topology": "required",
    f"{GROUP}/podset-preferred-topology": "preferred",
    f"{GROUP}/podset-unconstrained-topology": "unconstrained",
    f"{GROUP}/podset-slice-required-topology": "podSetSliceRequiredTopology",
    f"{GROUP}/podset-slice-size": "podSetSliceSize",
}
"""Kueue's topology annotations of a pod template and the ``topologyRequest`` field each
fills (``jobframework``'s ``NewPodSetTopologyRequest``)."""


def topology_request(template: JsonDict) -> JsonDict | None:
    """A pod set's ``topologyRequest`` from Kueue's annotations on its pod template (set
    through the component's ``pod.annotations``), as Kueue builds it for its own jobs."""
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    request: JsonDict = {}
    for key, field in _TOPOLOGY_ANNOTATIONS.items():
        if key not in annotations:
            continue
        value: Any = annotations[key]
        if field == "unconstrained":
            value = str(value).lower() == "true"
        elif field == "podSetSliceSize":
            value = int(value) if str(value).isdigit() else value
        request[field] = value
    return request or None


MAX_EXEC_TIME_LABEL = f"{GROUP}/max-exec-time-seconds"
"""Kueue's label for a job's maximum execution time (seconds admitted before it is evicted
and deactivated): a positive integer, anything else is ignored, as Kueue's
``MaximumExecutionTimeSecondsForObject`` does."""


def max_execution_seconds(deadline_s: int | None, label: str | None) -> int | None:
    """The Workload's ``maximumExecutionTimeSeconds``: the shorter of the run's deadline and
    its :data:`MAX_EXEC_TIME_LABEL` (None: neither)."""
    found: list[int] = [deadline_s] if deadline_s is not None and deadline_s > 0 else []
    if label is not None:
        try:
            value = int(label)
        except ValueError:
            value = 0
        if 0 < value < 2**31:
            found.append(value)
    return min(found) if found else None


_PLACEMENT_FIELDS = (
    "nodeSelector",
    "affinity",
    "tolerations",
    "priorityClassName",
    "runtimeClassName",
)
"""Pod-spec fields that decide where a pod set's pods may run, which Kueue checks a Workload's
admission against (flavor node labels and taints, TAS): an edit to them is a new shape."""


def _requests(container: JsonDict) -> JsonDict:
    """What Kueue counts of a container: its requests, a limit standing in for a missing
    request (as the API server defaults requests from limits)."""
    resources = container.get("resources") or {}
    return {**(resources.get("limits") or {}), **(resources.get("requests") or {})}


def admitted_shape(pod_sets: list[JsonDict]) -> list[JsonDict]:
    """What Kueue admits of a Workload's pod sets: per pod set its name, count, containers'
    (and init containers') requests and placement fields. Two Workloads with the same shape
    need no new admission: only a change to it replaces the Workload (stop and requeue); an
    operator release that renders other details differently (commands, probes, labels,
    environment) leaves admitted runs alone."""
    shape: list[JsonDict] = []
    for pod_set in pod_sets:
        pod = (pod_set.get("template") or {}).get("spec") or {}
        shape.append(
            {
                "name": pod_set.get("name"),
                "count": pod_set.get("count"),
                "containers": [_requests(c) for c in pod.get("containers") or []],
                "initContainers": [_requests(c) for c in pod.get("initContainers") or []],
                **{f: pod[f] for f in _PLACEMENT_FIELDS if pod.get(f)},
            }
        )
    return shape


def holds_resources(pod: JsonDict) -> bool:
    """Whether a pod of the run may still hold what Kueue admitted: every pod that has not
    ended (``Succeeded``/``Failed``), ready or not, scheduled or not, terminating too (its
    containers run until its grace period ends). Kueue's pod integration counts every Running
    pod, terminating ones too (``pod_controller.go`` ``IsActive``); a Pending pod is counted as
    well here, since it may start on the admitted nodes at any moment."""
    return (pod.get("status") or {}).get("phase") not in _FINISHED_PHASES


def idle(pods: list[JsonDict]) -> bool:
    """Whether none of the run's pods (all those labelled with the run) holds resources: the
    only moment the quota may be given back or the Workload deleted."""
    return not any(holds_resources(pod) for pod in pods)


def finalizer_patch(workload: JsonDict, *, present: bool) -> JsonDict | None:
    """The merge patch that adds (``present``) or removes :data:`RESOURCE_IN_USE` on the
    Workload, keeping every other finalizer; None when it is already so. It carries the
    Workload's ``resourceVersion`` (finalizers are one list: a concurrent write wins, 409)."""
    meta = workload.get("metadata") or {}
    finalizers = list(meta.get("finalizers") or [])
    if (RESOURCE_IN_USE in finalizers) == present:
        return None
    wanted = (
        [*finalizers, RESOURCE_IN_USE]
        if present
        else [f for f in finalizers if f != RESOURCE_IN_USE]
    )
    return {"metadata": {"resourceVersion": meta.get("resourceVersion"), "finalizers": wanted}}


def condition(workload: JsonDict | None, type_: str) -> JsonDict:
    """A condition of the Workload's status by type ({} when absent)."""
    for cond in ((workload or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return {}


def _true(workload: JsonDict, type_: str) -> bool:
    return condition(workload, type_).get("status") == "True"


def admission(workload: JsonDict | None) -> Admission:
    """The admission state of a run's Workload (None: it does not exist yet)."""
    if workload is None:
        return Admission()
    wl_status = workload.get("status") or {}
    evicted = _true(workload, "Evicted")
    admitted = _true(workload, "Admitted") and not evicted
    assignments = (wl_status.get("admission") or {}).get("podSetAssignments") or []
    flavors = {
        str(a.get("name")): {str(k): str(v) for k, v in (a.get("flavors") or {}).items()}
        for a in assignments
    }
    updates: dict[str, list[JsonDict]] = {}
    for check in wl_status.get("admissionChecks") or []:
        for update in check.get("podSetUpdates") or []:
            updates.setdefault(str(update.get("name")), []).append(update)
    if evicted:
        cause = condition(workload, "Evicted")
    elif not admitted:
        cause = condition(workload, "QuotaReserved") or condition(workload, "Admitted")
    else:
        cause = condition(workload, "Admitted")
    return Admission(
        exists=True,
        name=str((workload.get("metadata") or {}).get("name") or ""),
        topology=frozenset(str(a.get("name")) for a in assignments if a.get("topologyAssignment")),
        checks=tuple(str(check.get("name")) for check in wl_status.get("admissionChecks") or []),
        uid=str((workload.get("metadata") or {}).get("uid") or ""),
        admitted=admitted,
        evicted=evicted,
        reserved=bool(wl_status.get("admission")),
        active=(workload.get("spec") or {}).get("active") is not False,
        finished=_true(workload, "Finished"),
        reason=str(cause.get("reason") or ""),
        message=str(cause.get("message") or ""),
        flavors=flavors,
        updates=updates,
    )


def placement(admitted: Admission, flavor_objects: dict[str, JsonDict]) -> dict[str, Placement]:
    """Per pod set, what its pods get from admission: the node labels and tolerations of the
    ResourceFlavors it was admitted on, then its admission checks' ``podSetUpdates``."""
    out: dict[str, Placement] = {}
    for pod_set in sorted({*admitted.flavors, *admitted.updates}):
        selector: dict[str, str] = {}
        tolerations: list[JsonDict] = []
        labels: dict[str, str] = {}
        annotations: dict[str, str] = {}
        gates: tuple[str, ...] = ()
        if pod_set in admitted.topology:
            # Topology-aware scheduling, as Kueue starts its own jobs' pods
            # (podset.FromAssignment): gated until Kueue's topology ungater, which finds them
            # by these, gives each pod the nodes of its assigned domain.
            labels[PODSET_LABEL] = pod_set
            annotations[WORKLOAD_ANNOTATION] = admitted.name
            gates = (TOPOLOGY_GATE,)
        for name in sorted(set(admitted.flavors.get(pod_set, {}).values())):
            spec = (flavor_objects.get(name) or {}).get("spec") or {}
            selector.update(spec.get("nodeLabels") or {})
            tolerations += [t for t in spec.get("tolerations") or [] if t not in tolerations]
        for update in admitted.updates.get(pod_set, []):
            selector.update(update.get("nodeSelector") or {})
            tolerations += [t for t in update.get("tolerations") or [] if t not in tolerations]
            labels.update(update.get("labels") or {})
            annotations.update(update.get("annotations") or {})
        out[pod_set] = Placement(selector, tolerations, labels, annotations, gates)
    return out


def conflicts(pod_sets: list[JsonDict], placements: dict[str, Placement]) -> str:
    """Why admission cannot be applied to the pod sets ("" when it can): a node label of the
    admitted flavor (or a pod set update) that the pod set's own ``nodeSelector`` sets to
    another value. Kueue refuses to start a job so (``podset.Merge``'s conflict, reported as
    ``BadPodSetsUpdateError``) rather than pick one silently."""
    found: list[str] = []
    for pod_set in pod_sets:
        where = placements.get(str(pod_set.get("name")))
        if where is None:
            continue
        own = ((pod_set.get("template") or {}).get("spec") or {}).get("nodeSelector") or {}
        for key, value in sorted(where.node_selector.items()):
            if key in own and own[key] != value:
                found.append(
                    f"pod set {pod_set['name']}: nodeSelector {key}={own[key]} conflicts with "
                    f"{key}={value} of its admission"
                )
    return "; ".join(found)


def place(template: JsonDict, where: Placement | None) -> None:
    """Add a pod set's tolerations, labels and annotations from admission to a pod template
    (in place; its node selector goes through :func:`aflowrl_operator.pods.placement`)."""
    if where is None:
        return
    pod = template.setdefault("spec", {})
    if where.tolerations:
        own = list(pod.get("tolerations") or [])
        pod["tolerations"] = own + [copy.deepcopy(t) for t in where.tolerations if t not in own]
    if where.scheduling_gates:
        own_gates = list(pod.get("schedulingGates") or [])
        names = {g.get("name") for g in own_gates}
        pod["schedulingGates"] = own_gates + [
            {"name": g} for g in where.scheduling_gates if g not in names
        ]
    meta = template.setdefault("metadata", {})
    if where.labels:
        meta["labels"] = {**where.labels, **(meta.get("labels") or {})}
    if where.annotations:
        meta["annotations"] = {**where.annotations, **(meta.get("annotations") or {})}


def priority_fields(api_version: str, priority: Priority | None) -> JsonDict:
    """The Workload spec fields naming a run's priority class and its value, as Kueue's own
    integrations fill them (``priorityClassRef`` in v1beta2; ``priorityClassName`` and
    ``priorityClassSource`` in v1beta1; ``priority`` in both). A class that does not exist
    names nothing: Kueue refuses a class without its value, so the run queues at the default."""
    if priority is None or priority.value is None:
        return {}
    workload_class = priority.kind == WORKLOAD_PRIORITY_CLASS
    out: JsonDict = {}
    if api_version.endswith("/v1beta1"):
        out["priorityClassName"] = priority.name
        out["priorityClassSource"] = (
            f"{GROUP}/workloadpriorityclass"
            if workload_class
            else "scheduling.k8s.io/priorityclass"
        )
    else:
        out["priorityClassRef"] = {
            "group": GROUP if workload_class else "scheduling.k8s.io",
            "kind": priority.kind,
            "name": priority.name,
        }
    out["priority"] = priority.value
    return out


_PRIORITY_FIELDS = ("priorityClassRef", "priorityClassName", "priorityClassSource", "priority")


def _workload_class(spec: JsonDict) -> str:
    """The WorkloadPriorityClass a Workload spec names ("" for none or a PriorityClass)."""
    ref = spec.get("priorityClassRef") or {}
    if ref.get("kind") == WORKLOAD_PRIORITY_CLASS:
        return str(ref.get("name") or "")
    if spec.get("priorityClassSource") == f"{GROUP}/workloadpriorityclass":
        return str(spec.get("priorityClassName") or "")
    return ""


def priority_patch(live: JsonDict, wanted: JsonDict) -> JsonDict | None:
    """The merge patch moving an admitted Workload to the run's new WorkloadPriorityClass
    and its value (None: nothing to move). Kueue lets a running job change its
    WorkloadPriorityClass, not gain or lose one (``ValidateUpdateForWorkloadPriorityClassName``
    in its ``jobframework/validation.go``), and updates the Workload's priority with it."""
    old, new = live.get("spec") or {}, wanted.get("spec") or {}
    if not _workload_class(old) or not _workload_class(new):
        return None
    changed = {f: new.get(f) for f in _PRIORITY_FIELDS if new.get(f) != old.get(f)}
    if not changed:
        return None
    version = (live.get("metadata") or {}).get("resourceVersion")
    return {"metadata": {"resourceVersion": version}, "spec": changed}


def _set_condition(conditions: list[JsonDict], new: JsonDict, now: str) -> bool:
    """Set a condition like ``meta.SetStatusCondition``: the transition time moves only when
    the status does. True when anything changed."""
    for i, cond in enumerate(conditions):
        if cond.get("type") != new["type"]:
            continue
        merged = {**cond, **new}
        if cond.get("status") != new["status"]:
            merged["lastTransitionTime"] = now
        if merged == cond:
            return False
        conditions[i] = merged
        return True
    conditions.append({**new, "lastTransitionTime": now})
    return True


def _status_patch(workload: JsonDict, conditions: list[JsonDict], **extra: Any) -> JsonDict:
    """A merge patch of the Workload's status that fails (HTTP 409) if Kueue wrote since it
    was read: conditions are one list, so the patch carries the version it was based on."""
    version = (workload.get("metadata") or {}).get("resourceVersion")
    return {
        "metadata": {"resourceVersion": version},
        "status": {"conditions": conditions, **extra},
    }


def pods_ready(workload: JsonDict, ready: bool, now: str) -> JsonDict | None:
    """The status patch that sets the Workload's ``PodsReady`` condition (None: unchanged).

    The same reasons as Kueue's own integrations: True ``Started`` (``Recovered`` after a
    failure) when every pod of the admitted run is ready, False ``WaitForStart`` before that and
    while not admitted, False ``WaitForRecovery`` once a ready run loses a pod.
    """
    previous = condition(workload, "PodsReady")
    admitted = admission(workload).admitted
    new: JsonDict
    if admitted and ready:
        recovering = previous.get("reason") in {"WaitForRecovery", "Recovered"}
        new = {
            "type": "PodsReady",
            "status": "True",
            "reason": "Recovered" if recovering else "Started",
            "message": "All pods reached readiness and the workload is running",
        }
    elif admitted and (
        previous.get("status") == "True" or previous.get("reason") == "WaitForRecovery"
    ):
        new = {
            "type": "PodsReady",
            "status": "False",
            "reason": "WaitForRecovery",
            "message": "At least one pod has failed, waiting for recovery",
        }
    else:
        new = {
            "type": "PodsReady",
            "status": "False",
            "reason": "WaitForStart",
            "message": "Not all pods are ready or succeeded",
        }
    new["observedGeneration"] = (workload.get("metadata") or {}).get("generation") or 1
    conditions = [dict(c) for c in (workload.get("status") or {}).get("conditions") or []]
    if not _set_condition(conditions, new, now):
        return None
    return _status_patch(workload, conditions)


def release(workload: JsonDict, now: str) -> JsonDict | None:
    """The status patch giving an evicted Workload's quota back once the run stopped, as
    Kueue's job reconciler does: ``Requeued`` (True at once after a preemption or node
    failure), ``QuotaReserved`` and ``Admitted`` False, ``status.admission`` cleared. Kueue
    then requeues the same Workload. None when there is nothing to release."""
    evicted = condition(workload, "Evicted")
    if evicted.get("status") != "True" or not (workload.get("status") or {}).get("admission"):
        return None
    generation = (workload.get("metadata") or {}).get("generation") or 1
    message = str(evicted.get("message") or "")
    reason = str(evicted.get("reason") or "")
    conditions = [dict(c) for c in (workload.get("status") or {}).get("conditions") or []]
    for cond in (
        {
            "type": "Requeued",
            "status": "True" if reason in _REQUEUED_REASONS else "False",
            "reason": reason or "Evicted",
        },
        {"type": "QuotaReserved", "status": "False", "reason": "Pending"},
        {"type": "Admitted", "status": "False", "reason": "NoReservation"},
    ):
        _set_condition(
            conditions, {**cond, "message": message, "observedGeneration": generation}, now
        )
    return _status_patch(workload, conditions, admission=None)


def finished(workload: JsonDict, succeeded: bool, message: str, now: str) -> JsonDict | None:
    """The status patch marking a finished run's Workload ``Finished`` (Kueue then releases
    its quota and stops queueing it); None when it already is."""
    if _true(workload, "Finished"):
        return None
    conditions = [dict(c) for c in (workload.get("status") or {}).get("conditions") or []]
    _set_condition(
        conditions,
        {
            "type": "Finished",
            "status": "True",
            "reason": "Succeeded" if succeeded else "Failed",
            "message": message or ("training finished" if succeeded else "training failed"),
            "observedGeneration": (workload.get("metadata") or {}).get("generation") or 1,
        },
        now,
    )
    return _status_patch(workload, conditions)


def suspended_by_kueue(run: JsonDict) -> bool:
    """Whether the run's ``spec.suspend`` is the operator's (Kueue's) rather than the user's."""
    annotations = (run.get("metadata") or {}).get("annotations") or {}
    return bool(
        (run.get("spec") or {}).get("suspend")
        and annotations.get(RUN_SUSPENDED_BY) == RUN_SUSPENDED_BY_KUEUE
    )


def suspend_patch(run: JsonDict, *, held: bool) -> JsonDict | None:
    """The merge patch that makes a run's ``spec.suspend`` tell whether Kueue holds it, as
    Kueue's own job integrations keep ``spec.suspend`` of their jobs; None when it does.

    ``held``: the run would run but Kueue has not admitted it (queued, evicted, its Workload
    being replaced). Held and not suspended: ``spec.suspend: true`` with the
    :data:`RUN_SUSPENDED_BY` marker. Not held and the marker set: ``spec.suspend: false``,
    the marker removed. A suspend without the marker (the user's) is never touched: a held
    run is never user-suspended. The patch carries the run's ``resourceVersion``, so a user's
    write meanwhile wins (HTTP 409) and the next pass decides again.
    """
    meta = run.get("metadata") or {}
    marked = (meta.get("annotations") or {}).get(RUN_SUSPENDED_BY) == RUN_SUSPENDED_BY_KUEUE
    suspend = bool((run.get("spec") or {}).get("suspend"))
    version = {"resourceVersion": meta["resourceVersion"]} if meta.get("resourceVersion") else {}
    if held and not (suspend and marked):
        if suspend:  # the user's suspend: the run is not held (callers never ask this)
            return None
        return {
            "metadata": {**version, "annotations": {RUN_SUSPENDED_BY: RUN_SUSPENDED_BY_KUEUE}},
            "spec": {"suspend": True},
        }
    if not held and marked:
        patch: JsonDict = {"metadata": {**version, "annotations": {RUN_SUSPENDED_BY: None}}}
        if suspend:
            patch["spec"] = {"suspend": False}
        return patch
    return None
