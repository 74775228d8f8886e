"""Kueue admission of a run, read from its Workload (pure functions).

A TrainingRun labelled ``kueue.x-k8s.io/queue-name: <LocalQueue>`` is admitted by Kueue as one
``Workload`` (``kueue.x-k8s.io/v1beta1``) that the operator creates for it, owned by the run,
with one pod set per component (:func:`aflowrl_operator.children.kueue_workload`): Kueue's
scheduler and workload controller do not care which controller owns a Workload, so this is
Kueue's own all-or-nothing admission of the whole run (rollout, learner, environment, trainer
and a served executor), with its quota, preemption and fair sharing. Until the Workload is
admitted the run is held: every component at zero and the trainer Job suspended, the way Kueue
holds a suspended Job. Kueue-managed namespaces that set ``manageJobsWithoutQueueName`` must
list ``TrainingRun.v1alpha1.aflowrl.io`` in Kueue's ``integrations.externalFrameworks``, so the
run's own Job (owned by the run) is not queued a second time (README).
"""

from __future__ import annotations

import dataclasses
from typing import Any

JsonDict = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Admission:
    """What Kueue decided: ``admitted``, ``evicted`` (after having been admitted), the flavors
    assigned to each pod set (pod set -> resource -> ResourceFlavor name) and Kueue's message."""

    exists: bool = False
    admitted: bool = False
    evicted: bool = False
    flavors: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    message: str = ""


def _condition(workload: JsonDict, type_: str) -> JsonDict:
    for cond in (workload.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return {}


def admission(workload: JsonDict | None) -> Admission:
    """The admission state of a run's Workload (None: it does not exist yet)."""
    if workload is None:
        return Admission()
    evicted = _condition(workload, "Evicted").get("status") == "True"
    admitted = _condition(workload, "Admitted").get("status") == "True" and not evicted
    assignments = ((workload.get("status") or {}).get("admission") or {}).get(
        "podSetAssignments"
    ) or []
    flavors = {
        str(a.get("name")): {str(k): str(v) for k, v in (a.get("flavors") or {}).items()}
        for a in assignments
    }
    waiting = _condition(workload, "QuotaReserved")
    message = (
        _condition(workload, "Evicted").get("message", "")
        if evicted
        else waiting.get("message", "")
    )
    return Admission(
        exists=True, admitted=admitted, evicted=evicted, flavors=flavors, message=message or ""
    )


def node_labels(flavors: dict[str, str], flavor_objects: dict[str, JsonDict]) -> dict[str, str]:
    """The node labels of the ResourceFlavors a pod set was admitted on (merged)."""
    labels: dict[str, str] = {}
    for name in sorted(set(flavors.values())):
        spec = (flavor_objects.get(name) or {}).get("spec") or {}
        labels.update(spec.get("nodeLabels") or {})
    return labels
