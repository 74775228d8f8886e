"""A TrainingRun's status, computed from what its children report (pure functions).

The reconciler (:mod:`aflowrl_operator.reconcile`) reads the children, pods and nodes, turns
them into an :class:`Observation`, and :func:`compute` gives the status fields the operator owns:
``observedGeneration``, ``conditions``, ``totalIterations``, the ready replica counts, and the
start and completion times. The trainer owns the training fields (iteration, best score, policy
version...) and patches them itself, so the two never overwrite each other.

Conditions follow the Kubernetes API conventions: one per type, CamelCase reasons, readable
messages, ``lastTransitionTime`` kept while the status does not change. A component that has
been ready and no longer is (reason ``ReplicasUnavailable``) makes the run ``Degraded``; one
that is still starting does not. Its history is read from its previous condition, so the
operator keeps no state of its own.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aflowrl.config import CONDITION_TYPES, RunSpec
from aflowrl_operator.names import COMPONENT_LABEL
from aflowrl_operator.validation import Rejection

JsonDict = dict[str, Any]

Problem = tuple[str, str]
"""(CamelCase reason, readable message)."""

FORBIDDEN = "Forbidden"
"""Degraded's reason when the API server's RBAC refused one of the pass's requests (the
message names the verb and the object): the rest of the pass, the Workload sync and the status
write included, still happened."""

# Component condition reasons that do not mean anything is wrong.
_HEALTHY_REASONS = frozenset(
    {
        "AllReplicasReady",
        "Starting",
        "Creating",
        "Suspended",
        "Queued",
        "RunFinished",
        "InvalidSpec",
    }
)
# Pod container states worth reporting, in the order a reader should see them.
_BAD_WAITING = (
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
)
# Reasons a service states when it refuses to start (its termination message carries the reason
# in parentheses: ``aflowrl.common.rdma.check``); a crash-looping pod reports that reason.
_STARTUP_REFUSALS = ("RdmaUnavailable",)
# Degraded's reason when several problems are present: the first one found in this order.
_DEGRADED_PRIORITY = (
    "InvalidSpec",
    "ImmutableFieldChanged",
    "ChildConflict",
    FORBIDDEN,
    "ChildRejected",
    "MultiNodeUnavailable",
    "RdmaUnavailable",
    "Unschedulable",
    # Kueue (aflowrl_operator.kueue): the run is held, not broken.
    "PlacementFailed",
    "QueueNameImmutable",
    "LocalQueueMissing",
    "MultiKueueUnsupported",
    *_BAD_WAITING,
    "ReplicasUnavailable",
)
_WARNING_REASONS = frozenset(
    {*_DEGRADED_PRIORITY, "TrainerFailed", "Failed", "Evicted", "Deactivated"}
)
"""Condition reasons that report a problem (their Events are Warnings)."""
_MAX_LAST_ERROR = 4096
"""Longest ``lastError.message`` kept (its end: the log's last lines)."""
_LAST_ERROR_KEYS = ("component", "pod", "container", "reason", "exitCode", "message", "time")
_MAX_MESSAGE = 4000
"""Longest condition message (the API allows 32768; kubectl describe stays readable)."""
_COMPONENT_CONDITIONS = (
    ("RolloutReady", "rollout"),
    ("LearnerReady", "learner"),
    ("EnvironmentReady", "environment"),
)


@dataclasses.dataclass(frozen=True)
class Workload:
    """A Deployment or StatefulSet as observed: desired and ready pods, and its pods' problems."""

    exists: bool = False
    desired: int = 0
    ready: int = 0
    problems: tuple[Problem, ...] = ()


@dataclasses.dataclass(frozen=True)
class TrainerJob:
    """The trainer Job as observed."""

    exists: bool = False
    suspended: bool = False
    active: int = 0
    ready: int = 0
    complete: bool = False
    failed: bool = False
    failure_message: str = ""
    start_time: str | None = None
    completion_time: str | None = None
    problems: tuple[Problem, ...] = ()

    @property
    def finished(self) -> bool:
        return self.complete or self.failed


@dataclasses.dataclass(frozen=True)
class Observation:
    """Everything the status is computed from.

    ``spec`` is the accepted spec the children follow (None when no spec was ever accepted);
    ``rejection`` why the current spec is not applied; ``environment`` folds in the served
    executor; ``unschedulable`` lists GPU requests no node can meet; ``apply_problems`` children
    the operator could not write (name conflicts, API rejections); ``queued`` why Kueue holds
    the run (None when it is not queued), ``evicted`` whether Kueue took back its admission,
    ``deactivated`` whether Kueue deactivated its Workload (``spec.active: false``),
    ``admission`` the ``Admitted`` condition (status, reason, message) of a queued run (None:
    not queued);
    ``kept`` whether the services keep running after the end (``trainer.keepPodsAfterEnd``);
    ``last_error`` the run's ``status.lastError`` (:func:`last_error`).
    """

    spec: RunSpec | None
    rejection: Rejection | None = None
    suspended: bool = False
    queued: str | None = None
    rollout: Workload = Workload()
    learner: Workload = Workload()
    environment: Workload = Workload()
    trainer: TrainerJob = TrainerJob()
    unschedulable: tuple[str, ...] = ()
    apply_problems: tuple[Problem, ...] = ()
    evicted: bool = False
    deactivated: bool = False
    admission: tuple[bool, str, str] | None = None
    kept: bool = False
    last_error: JsonDict | None = None


def job_state(job: JsonDict | None, problems: tuple[Problem, ...] = ()) -> TrainerJob:
    """A trainer Job's state from its object (None: it does not exist)."""
    if job is None:
        return TrainerJob()
    status = job.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    failed = conditions.get("Failed", {}).get("status") == "True"
    complete = conditions.get("Complete", {}).get("status") == "True"
    failure = conditions.get("Failed", {})
    return TrainerJob(
        exists=True,
        suspended=bool((job.get("spec") or {}).get("suspend")),
        active=int(status.get("active") or 0),
        ready=int(status.get("ready") or 0),
        complete=complete,
        failed=failed,
        failure_message=(
            f"{failure.get('reason', 'Failed')}: {failure.get('message', '')}".strip(": ")
            if failed
            else ""
        ),
        start_time=status.get("startTime"),
        completion_time=status.get("completionTime")
        or (failure.get("lastTransitionTime") if failed else None),
        problems=problems,
    )


def workload_state(
    obj: JsonDict | None, desired: int, problems: tuple[Problem, ...] = ()
) -> Workload:
    """A Deployment's or StatefulSet's state from its object (None: it does not exist)."""
    if obj is None:
        return Workload(desired=desired, problems=problems)
    status = obj.get("status") or {}
    found = list(problems)
    for cond in status.get("conditions") or []:
        if cond.get("reason") == "ProgressDeadlineExceeded" and cond.get("status") == "False":
            found.append(
                ("ReplicasUnavailable", f"{obj['metadata']['name']}: {cond.get('message')}")
            )
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            found.append(("ChildRejected", f"{obj['metadata']['name']}: {cond.get('message')}"))
    return Workload(
        exists=True,
        desired=desired,
        ready=int(status.get("readyReplicas") or 0),
        problems=tuple(found),
    )


def combine(a: Workload, b: Workload) -> Workload:
    """Two workloads seen as one component (the environment and its served executor)."""
    return Workload(
        exists=a.exists and b.exists,
        desired=a.desired + b.desired,
        ready=a.ready + b.ready,
        problems=a.problems + b.problems,
    )


def pod_problems(pod: JsonDict) -> list[Problem]:
    """What keeps a pod from running: unschedulable, crash loops, image pulls."""
    name = pod.get("metadata", {}).get("name", "?")
    status = pod.get("status") or {}
    found: list[Problem] = []
    for cond in status.get("conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            found.append(
                ("Unschedulable", f"pod {name} cannot be scheduled: {cond.get('message')}")
            )
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in _BAD_WAITING:
            terminated = (cs.get("lastState") or {}).get("terminated") or {}
            last = terminated.get("reason")
            said = terminated.get("message") or ""
            refused = next((r for r in _STARTUP_REFUSALS if f"({r})" in said), None)
            if refused is not None:  # the service said why it stopped: that is the problem
                found.append((refused, f"pod {name} container {cs.get('name')}: {said.strip()}"))
                continue
            detail = waiting.get("message") or (f"last exit: {last}" if last else "")
            message = f"pod {name} container {cs.get('name')}: {reason}"
            found.append((reason, f"{message} ({detail})" if detail else message))
    return found


def _condition(
    type_: str,
    status: bool,
    *,
    reason: str,
    message: str,
    previous: dict[str, JsonDict],
    generation: int | None,
    now: str,
) -> JsonDict:
    text = "True" if status else "False"
    if len(message) > _MAX_MESSAGE:
        message = message[: _MAX_MESSAGE - 3] + "..."
    before = previous.get(type_)
    since = before["lastTransitionTime"] if before and before.get("status") == text else now
    out: JsonDict = {
        "type": type_,
        "status": text,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def _component(
    label: str, work: Workload, previous: JsonDict | None, obs: Observation
) -> tuple[bool, str, str]:
    if obs.spec is None:
        return False, "InvalidSpec", f"no valid spec: the {label} is not created"
    if obs.trainer.finished and obs.kept:
        return False, "RunFinished", f"the run has finished: the {label} pods are kept"
    if obs.trainer.finished:
        return False, "RunFinished", f"the run has finished: the {label} is scaled to zero"
    if obs.suspended:
        return False, "Suspended", f"the run is suspended: the {label} is scaled to zero"
    if obs.queued is not None:
        return False, "Queued", f"{obs.queued}: the {label} is scaled to zero"
    if not work.exists:
        return False, "Creating", f"creating the {label}"
    count = f"{work.ready}/{work.desired} {label} pods ready"
    if work.desired > 0 and work.ready >= work.desired:
        return True, "AllReplicasReady", count
    if work.problems:
        reason = _first_reason([r for r, _ in work.problems])
        return False, reason, f"{count}: " + "; ".join(m for _, m in work.problems)
    was_ready = previous is not None and (
        previous.get("status") == "True" or previous.get("reason") == "ReplicasUnavailable"
    )
    if was_ready:
        return False, "ReplicasUnavailable", f"{count} (it was ready)"
    return False, "Starting", count


def _first_reason(reasons: list[str]) -> str:
    for reason in _DEGRADED_PRIORITY:
        if reason in reasons:
            return reason
    return reasons[0]


def _trainer(obs: Observation) -> tuple[bool, str, str]:
    job = obs.trainer
    if obs.spec is None:
        return False, "InvalidSpec", "no valid spec: the trainer is not created"
    if job.complete:
        return False, "Completed", "the trainer finished"
    if job.failed:
        return False, "Failed", f"the trainer failed: {job.failure_message}"
    if not job.exists:
        return False, "Creating", "creating the trainer Job"
    if obs.queued is not None and not obs.suspended:
        return False, "Queued", f"{obs.queued}: the trainer is suspended"
    if obs.suspended or job.suspended:
        return False, "Suspended", "the run is suspended: the trainer is stopped"
    if job.ready > 0:
        return True, "Running", "the trainer is running"
    if job.problems:
        reason = _first_reason([r for r, _ in job.problems])
        return False, reason, "; ".join(m for _, m in job.problems)
    if job.active > 0:
        return False, "Starting", "the trainer pod is starting"
    return False, "Pending", "waiting for the Job to start the trainer pod"


def compute(
    obs: Observation, previous_status: JsonDict | None, generation: int | None, now: str
) -> JsonDict:
    """The operator-owned status fields for this observation (see the module docstring)."""
    prev_status = previous_status or {}
    previous = {c.get("type"): c for c in prev_status.get("conditions") or [] if c.get("type")}
    conds: dict[str, tuple[bool, str, str]] = {}
    parts = {"rollout": obs.rollout, "learner": obs.learner, "environment": obs.environment}
    for type_, label in _COMPONENT_CONDITIONS:
        conds[type_] = _component(label, parts[label], previous.get(type_), obs)
    conds["TrainerRunning"] = _trainer(obs)

    problems: list[Problem] = []
    if obs.rejection is not None:
        problems += [(obs.rejection.reason, line) for line in obs.rejection.problems]
    problems += list(obs.apply_problems)
    problems += [("Unschedulable", line) for line in obs.unschedulable]
    for type_, _ in (*_COMPONENT_CONDITIONS, ("TrainerRunning", "trainer")):
        ok, reason, message = conds[type_]
        if not ok and reason not in _HEALTHY_REASONS | {"Completed", "Failed", "Pending"}:
            problems.append((reason, message))
    degraded = bool(problems)
    degraded_reason = _first_reason([r for r, _ in problems]) if degraded else "AsExpected"
    degraded_message = (
        "; ".join(dict.fromkeys(m for _, m in problems)) if degraded else "no problem found"
    )
    conds["Degraded"] = (degraded, degraded_reason, degraded_message)

    job = obs.trainer
    running = all(conds[t][0] for t, _ in _COMPONENT_CONDITIONS) and conds["TrainerRunning"][0]
    waiting = [
        conds[t][2] for t, _ in (*_COMPONENT_CONDITIONS, ("TrainerRunning", "")) if not conds[t][0]
    ]
    iterations = obs.spec.trainer.iterations if obs.spec is not None else None
    progress = f"iteration {prev_status.get('iteration') or 0} of {iterations}"
    if obs.spec is None:
        assert obs.rejection is not None
        ready = (False, "InvalidSpec", obs.rejection.message)
        progressing = (False, "InvalidSpec", "fix the spec: nothing is created until it is valid")
    elif job.complete:
        services = "kept (trainer.keepPodsAfterEnd)" if obs.kept else "scaled to zero"
        ready = (False, "Completed", f"training finished ({progress}); services {services}")
        progressing = (False, "Completed", "training finished")
    elif job.failed:
        ready = (False, "TrainerFailed", job.failure_message)
        progressing = (False, "TrainerFailed", job.failure_message)
    elif obs.suspended:
        ready = (False, "Suspended", "spec.suspend is true: every component is scaled to zero")
        progressing = (False, "Suspended", "spec.suspend is true")
    elif obs.queued is not None and obs.deactivated:
        ready = (False, "Deactivated", obs.queued)
        progressing = (False, "Deactivated", obs.queued)
    elif obs.queued is not None and obs.evicted:
        ready = (False, "Evicted", obs.queued)
        progressing = (True, "Evicted", obs.queued)
    elif obs.queued is not None:
        ready = (False, "Queued", obs.queued)
        progressing = (True, "Queued", obs.queued)
    elif running:
        ready = (True, "Training", progress)
        progressing = (True, "Training", progress)
    else:
        reason = degraded_reason if degraded else "ComponentsStarting"
        ready = (False, reason, "; ".join(waiting))
        progressing = (True, "ComponentsStarting", "; ".join(waiting))
    conds["Ready"] = ready
    conds["Progressing"] = progressing
    conds["Admitted"] = obs.admission or (
        True,
        "NotQueued",
        "not queued through Kueue (no kueue.x-k8s.io/queue-name label)",
    )
    conds["Succeeded"] = (
        (True, "TrainingComplete", f"training finished ({progress})")
        if job.complete
        else (False, "TrainerFailed" if job.failed else "InProgress", "the run has not succeeded")
    )
    conds["Failed"] = (
        (True, "TrainerFailed", job.failure_message)
        if job.failed
        else (False, "TrainingComplete" if job.complete else "InProgress", "the run has not failed")
    )

    out: JsonDict = {
        "observedGeneration": generation,
        "conditions": [
            _condition(
                t,
                conds[t][0],
                reason=conds[t][1],
                message=conds[t][2],
                previous=previous,
                generation=generation,
                now=now,
            )
            for t in CONDITION_TYPES
        ],
        "totalIterations": iterations,
        "rolloutReadyReplicas": obs.rollout.ready,
        "learnerReadyReplicas": obs.learner.ready,
        "environmentReadyReplicas": obs.environment.ready,
    }
    if job.start_time and not prev_status.get("startTime"):
        out["startTime"] = job.start_time
    if job.finished and job.completion_time and not prev_status.get("completionTime"):
        out["completionTime"] = job.completion_time
    if obs.last_error is not None:
        # Status is merge-patched: a key the new error lacks is written as null, so nothing of
        # an older error (its pod, its exit code) lingers in the new one.
        out["lastError"] = {**dict.fromkeys(_LAST_ERROR_KEYS), **obs.last_error}
    return out


def _terminations(pod: JsonDict) -> list[JsonDict]:
    """The failed exits (exit code not 0) a pod's containers report, as ``lastError`` values.

    A pod being deleted (scaled down, the run finished or suspended) was stopped, not failed:
    its exits are not errors, whatever code SIGTERM left.
    """
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return []
    component = (meta.get("labels") or {}).get(COMPONENT_LABEL) or "unknown"
    status = pod.get("status") or {}
    found = []
    for cs in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]:
        for state in (cs.get("state") or {}, cs.get("lastState") or {}):
            ended = state.get("terminated") or {}
            if not ended or ended.get("exitCode") in (0, None):
                continue
            found.append(
                {
                    "component": component,
                    "pod": meta.get("name"),
                    "container": cs.get("name"),
                    "reason": ended.get("reason") or "Error",
                    "exitCode": int(ended["exitCode"]),
                    "message": str(ended.get("message") or "")[-_MAX_LAST_ERROR:],
                    "time": ended.get("finishedAt"),
                }
            )
    return found


def last_error(
    pods: list[JsonDict], trainer: TrainerJob, previous: JsonDict | None
) -> JsonDict | None:
    """The run's ``status.lastError``: the newest failed container exit among its pods (its
    message is the termination message, the log's last lines under ``FallbackToLogsOnError``),
    else the trainer Job's own failure (a deadline, say) when no trainer exit explains it;
    ``previous`` is kept until something newer ends, so the evidence outlives the pods."""
    found = [t for pod in pods for t in _terminations(pod)]
    explained = any(t["component"] == "trainer" for t in found) or (
        previous is not None and previous.get("component") == "trainer"
    )
    if trainer.failed and not explained:
        reason, _, message = trainer.failure_message.partition(": ")
        found.append(
            {
                "component": "trainer",
                "reason": reason or "Failed",
                "message": message[-_MAX_LAST_ERROR:],
                "time": trainer.completion_time,
            }
        )
    if not found:
        return previous
    newest = max(found, key=lambda t: str(t.get("time") or ""))
    newest = {k: v for k, v in newest.items() if v is not None}
    if previous is not None and str(newest.get("time") or "") <= str(previous.get("time") or ""):
        return previous
    return newest


Event = tuple[str, str, str]
"""(type Normal | Warning, CamelCase reason, message) of a Kubernetes Event about the run."""


def transitions(previous_status: JsonDict | None, new_status: JsonDict) -> list[Event]:
    """The Events a status change deserves: one per condition whose status or reason changed
    (a condition seen for the first time only when it reports a problem), and one for a new
    ``lastError``. Problems are Warnings; everything else is Normal."""
    before = {c.get("type"): c for c in (previous_status or {}).get("conditions") or []}
    events: list[Event] = []
    for cond in new_status.get("conditions") or []:
        old = before.get(cond["type"])
        warning = _is_problem(cond)
        if old is None and not warning:
            continue
        if old is not None and (old.get("status"), old.get("reason")) == (
            cond["status"],
            cond["reason"],
        ):
            continue
        message = f"{cond['type']} is {cond['status']}: {cond['message']}"
        events.append(("Warning" if warning else "Normal", cond["reason"], message))
    error = new_status.get("lastError")
    if error is not None and _stored(error) != (previous_status or {}).get("lastError"):
        where = " ".join(
            part
            for part in (
                error["component"],
                f"pod {error['pod']}" if error.get("pod") else "",
                f"container {error['container']}" if error.get("container") else "",
            )
            if part
        )
        code = f" (exit code {error['exitCode']})" if error.get("exitCode") is not None else ""
        tail = (error.get("message") or "").strip().splitlines()[-3:]
        detail = ": " + " | ".join(tail) if tail else ""
        events.append(("Warning", "ComponentFailed", f"{where}: {error['reason']}{code}{detail}"))
    return events


def _is_problem(cond: JsonDict) -> bool:
    if cond["type"] in ("Degraded", "Failed"):
        return bool(cond["status"] == "True")
    if cond["type"] == "Succeeded":
        return False  # its False is the Failed condition's True, reported there
    if cond["type"] == "Admitted":
        return False  # Kueue's decisions are Normal Events; Ready reports an eviction's Warning
    return cond["status"] == "False" and cond["reason"] in _WARNING_REASONS


def _stored(value: Any) -> Any:
    """A status value as a merge patch leaves it stored: a map's null entries removed."""
    if isinstance(value, dict):
        return {k: _stored(v) for k, v in value.items() if v is not None}
    return value


def changed(new: JsonDict, current: JsonDict | None) -> bool:
    """Whether writing ``new`` would change ``current`` (only the keys ``new`` sets count)."""
    current = current or {}
    return any(current.get(key) != _stored(value) for key, value in new.items())
