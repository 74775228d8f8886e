"""Kueue's Workload read and written the way Kueue's own job integrations do (pure functions)."""

from __future__ import annotations

from typing import Any

from aflowrl_operator import kueue

NOW = "2026-11-27T19:00:00Z"
LATER = "2026-11-27T19:05:00Z"


def _workload(*conditions: dict[str, Any], admission: bool = True, **spec: Any) -> dict:
    status: dict[str, Any] = {"conditions": list(conditions)}
    if admission:
        status["admission"] = {
            "clusterQueue": "gpu",
            "podSetAssignments": [{"name": "trainer", "flavors": {"cpu": "spot"}, "count": 1}],
        }
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "demo-kueue", "uid": "u1", "resourceVersion": "7", "generation": 1},
        "spec": {"queueName": "q", **spec},
        "status": status,
    }


ADMITTED = (
    {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": ""},
    {"type": "Admitted", "status": "True", "reason": "Admitted", "message": ""},
)
EVICTED = {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "by prod"}


def _apply(workload: dict, patch: dict | None) -> dict:
    assert patch is not None
    assert patch["metadata"]["resourceVersion"] == "7"  # optimistic concurrency with Kueue
    status = {**workload["status"], **patch["status"]}
    return {**workload, "status": {k: v for k, v in status.items() if v is not None}}


def test_admission_reads_admitted_evicted_and_deactivated():
    assert kueue.admission(None) == kueue.Admission()
    admitted = kueue.admission(_workload(*ADMITTED))
    assert admitted.admitted and admitted.reserved and admitted.active and not admitted.evicted
    assert admitted.flavors == {"trainer": {"cpu": "spot"}}
    evicted = kueue.admission(_workload(*ADMITTED, EVICTED, active=False))
    assert evicted.evicted and not evicted.admitted and not evicted.active
    assert (evicted.reason, evicted.message) == ("Preempted", "by prod")
    pending = kueue.admission(
        _workload(
            {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "full"},
            admission=False,
        )
    )
    assert not pending.admitted and not pending.reserved and pending.message == "full"


def test_placement_merges_flavor_labels_tolerations_and_pod_set_updates():
    taint = {"key": "spot", "operator": "Exists", "effect": "NoSchedule"}
    workload = _workload(*ADMITTED)
    workload["status"]["admissionChecks"] = [
        {
            "name": "prov",
            "state": "Ready",
            "podSetUpdates": [
                {"name": "trainer", "nodeSelector": {"zone": "a"}, "annotations": {"x": "1"}}
            ],
        }
    ]
    flavors = {"spot": {"spec": {"nodeLabels": {"pool": "spot"}, "tolerations": [taint]}}}
    where = kueue.placement(kueue.admission(workload), flavors)["trainer"]
    assert where == kueue.Placement({"pool": "spot", "zone": "a"}, [taint], {}, {"x": "1"})
    template = {"metadata": {"annotations": {"x": "own"}}, "spec": {"tolerations": [taint]}}
    kueue.place(template, where)
    assert template["spec"]["tolerations"] == [taint]  # not twice
    assert template["metadata"]["annotations"] == {"x": "own"}  # the pod's own wins


def test_pods_ready_follows_kueues_reasons():
    queued = _workload(admission=False)
    waiting = _apply(queued, kueue.pods_ready(queued, False, NOW))
    assert kueue.condition(waiting, "PodsReady")["reason"] == "WaitForStart"
    assert kueue.pods_ready(waiting, False, LATER) is None  # unchanged: nothing to write
    admitted = _workload(*ADMITTED)
    ready = _apply(admitted, kueue.pods_ready(admitted, True, NOW))
    cond = kueue.condition(ready, "PodsReady")
    assert (cond["status"], cond["reason"], cond["lastTransitionTime"]) == ("True", "Started", NOW)
    lost = _apply(ready, kueue.pods_ready(ready, False, LATER))
    assert kueue.condition(lost, "PodsReady")["reason"] == "WaitForRecovery"
    back = _apply(lost, kueue.pods_ready(lost, True, LATER))
    assert kueue.condition(back, "PodsReady")["reason"] == "Recovered"


def test_release_gives_the_quota_back_like_kueues_job_reconciler():
    assert kueue.release(_workload(*ADMITTED), NOW) is None  # not evicted
    evicted = _workload(*ADMITTED, EVICTED)
    released = _apply(evicted, kueue.release(evicted, NOW))
    assert "admission" not in released["status"]
    assert kueue.condition(released, "QuotaReserved")["status"] == "False"
    assert kueue.condition(released, "Admitted")["status"] == "False"
    requeued = kueue.condition(released, "Requeued")
    assert (requeued["status"], requeued["reason"]) == ("True", "Preempted")
    assert kueue.release(released, LATER) is None  # already released
    timeout = _workload(*ADMITTED, {**EVICTED, "reason": "PodsReadyTimeout"})
    # Kueue itself requeues after its backoff: Requeued stays False here.
    after = _apply(timeout, kueue.release(timeout, NOW))
    assert kueue.condition(after, "Requeued")["status"] == "False"


def test_a_finished_run_marks_its_workload_finished_once():
    workload = _workload(*ADMITTED)
    done = _apply(workload, kueue.finished(workload, False, "BackoffLimitExceeded", NOW))
    cond = kueue.condition(done, "Finished")
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "True",
        "Failed",
        "BackoffLimitExceeded",
    )
    assert kueue.finished(done, False, "", LATER) is None


def test_priority_fields_per_api_version():
    wpc = kueue.Priority("high", kueue.WORKLOAD_PRIORITY_CLASS, 100)
    assert kueue.priority_fields("kueue.x-k8s.io/v1beta1", wpc) == {
        "priorityClassName": "high",
        "priorityClassSource": "kueue.x-k8s.io/workloadpriorityclass",
        "priority": 100,
    }
    pod_class = kueue.Priority("batch", kueue.PRIORITY_CLASS, 7)
    assert kueue.priority_fields("kueue.x-k8s.io/v1beta2", pod_class) == {
        "priorityClassRef": {
            "group": "scheduling.k8s.io",
            "kind": "PriorityClass",
            "name": "batch",
        },
        "priority": 7,
    }
    # Kueue refuses a class without its value: a missing class names nothing.
    missing = kueue.Priority("gone", kueue.PRIORITY_CLASS, None)
    assert kueue.priority_fields("kueue.x-k8s.io/v1beta2", missing) == {}
    assert kueue.priority_fields("kueue.x-k8s.io/v1beta2", None) == {}


def _run(suspend: bool, marker: str | None = None) -> dict:
    annotations = {kueue.RUN_SUSPENDED_BY: marker} if marker else {}
    return {
        "metadata": {"name": "demo", "resourceVersion": "7", "annotations": annotations},
        "spec": {"suspend": suspend},
    }


def test_a_held_run_is_suspended_by_the_operator_with_its_marker():
    assert kueue.suspend_patch(_run(False), held=True) == {
        "metadata": {"resourceVersion": "7", "annotations": {"aflowrl.io/suspended-by": "kueue"}},
        "spec": {"suspend": True},
    }
    assert kueue.suspend_patch(_run(True, "kueue"), held=True) is None  # already
    assert kueue.suspended_by_kueue(_run(True, "kueue"))
    assert not kueue.suspended_by_kueue(_run(True))
    assert not kueue.suspended_by_kueue(_run(True, "someone-else"))


def test_admission_unsuspends_only_the_operators_own_suspend():
    assert kueue.suspend_patch(_run(True, "kueue"), held=False) == {
        "metadata": {"resourceVersion": "7", "annotations": {"aflowrl.io/suspended-by": None}},
        "spec": {"suspend": False},
    }
    # A user's suspend (no marker) is never turned off, held or not.
    assert kueue.suspend_patch(_run(True), held=False) is None
    assert kueue.suspend_patch(_run(True), held=True) is None
    assert kueue.suspend_patch(_run(True, "someone-else"), held=False) is None
    # A marker left behind on a running run is removed; nothing else changes.
    assert kueue.suspend_patch(_run(False, "kueue"), held=False) == {
        "metadata": {"resourceVersion": "7", "annotations": {"aflowrl.io/suspended-by": None}}
    }
    assert kueue.suspend_patch(_run(False), held=False) is None


def test_the_maximum_execution_time_is_the_runs_deadline_or_kueues_label_the_shorter():
    assert kueue.max_execution_seconds(None, None) is None
    assert kueue.max_execution_seconds(3600, None) == 3600
    assert kueue.max_execution_seconds(None, "600") == 600
    assert kueue.max_execution_seconds(3600, "600") == 600
    assert kueue.max_execution_seconds(300, "600") == 300
    # As Kueue: a label that is not a positive 32-bit integer is ignored.
    for bad in ("0", "-5", "ten", "", str(2**31)):
        assert kueue.max_execution_seconds(None, bad) is None


def test_a_workload_priority_class_change_moves_an_admitted_workloads_priority():
    def spec(kind: str | None, name: str = "", value: int = 0) -> dict:
        if kind is None:
            return {"spec": {"queueName": "q"}}
        group = "kueue.x-k8s.io" if kind == kueue.WORKLOAD_PRIORITY_CLASS else "scheduling.k8s.io"
        ref = {"group": group, "kind": kind, "name": name}
        return {
            "metadata": {"resourceVersion": "7"},
            "spec": {"queueName": "q", "priorityClassRef": ref, "priority": value},
        }

    wpc = kueue.WORKLOAD_PRIORITY_CLASS
    patch = kueue.priority_patch(spec(wpc, "low", 10), spec(wpc, "high", 1000))
    assert patch == {
        "metadata": {"resourceVersion": "7"},
        "spec": {
            "priorityClassRef": {"group": "kueue.x-k8s.io", "kind": wpc, "name": "high"},
            "priority": 1000,
        },
    }
    assert kueue.priority_patch(spec(wpc, "low", 10), spec(wpc, "low", 10)) is None
    # Kueue refuses a WorkloadPriorityClass added to or removed from a running job.
    assert kueue.priority_patch(spec(None), spec(wpc, "high", 1000)) is None
    assert kueue.priority_patch(spec(wpc, "low", 10), spec(None)) is None
    assert (
        kueue.priority_patch(spec("PriorityClass", "a", 1), spec("PriorityClass", "b", 2)) is None
    )
