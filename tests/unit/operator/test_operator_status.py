"""Status computation: conditions from observed children, pods and nodes (pure functions)."""

from __future__ import annotations

import pytest

from aflowrl.config import CONDITION_TYPES, RunSpec, TrainingRunStatus
from aflowrl_operator import capacity, status
from aflowrl_operator.validation import Rejection

NOW, LATER = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"
SPEC = RunSpec()
READY = status.Workload(exists=True, desired=1, ready=1)
RUNNING_JOB = status.TrainerJob(exists=True, active=1, ready=1, start_time=NOW)


def _ok(**changes) -> status.Observation:
    fields = {
        "spec": SPEC,
        "rollout": READY,
        "learner": READY,
        "environment": status.Workload(exists=True, desired=2, ready=2),
        "trainer": RUNNING_JOB,
        **changes,
    }
    return status.Observation(**fields)


def _conds(out: dict) -> dict[str, dict]:
    return {c["type"]: c for c in out["conditions"]}


def test_a_running_run_is_ready_and_its_status_fits_the_model():
    out = status.compute(_ok(), {"iteration": 3}, generation=4, now=NOW)
    TrainingRunStatus.model_validate(out)  # the CRD's status schema accepts it
    conds = _conds(out)
    assert list(conds) == list(CONDITION_TYPES)
    assert conds["Ready"]["status"] == "True" and conds["Ready"]["reason"] == "Training"
    assert conds["Ready"]["message"] == "iteration 3 of 20"
    assert conds["Degraded"]["status"] == "False"
    assert all(c["observedGeneration"] == 4 for c in conds.values())
    assert out["observedGeneration"] == 4 and out["totalIterations"] == 20
    assert out["environmentReadyReplicas"] == 2 and out["startTime"] == NOW


def test_transition_times_move_only_when_the_status_flips():
    first = status.compute(_ok(), None, generation=1, now=NOW)
    same = status.compute(_ok(), first, generation=1, now=LATER)
    assert _conds(same)["Ready"]["lastTransitionTime"] == NOW
    down = _ok(environment=status.Workload(exists=True, desired=2, ready=1))
    flipped = status.compute(down, same, generation=1, now=LATER)
    assert _conds(flipped)["Ready"]["lastTransitionTime"] == LATER
    assert _conds(flipped)["Degraded"]["lastTransitionTime"] == LATER
    assert _conds(flipped)["RolloutReady"]["lastTransitionTime"] == NOW


def test_starting_is_progress_but_losing_a_ready_pod_is_degraded():
    starting = _ok(
        environment=status.Workload(exists=True, desired=2, ready=1),
        trainer=status.TrainerJob(exists=True, active=1),
    )
    out = status.compute(starting, None, generation=1, now=NOW)
    conds = _conds(out)
    assert conds["EnvironmentReady"]["reason"] == "Starting"
    assert conds["Degraded"]["status"] == "False"
    assert (conds["Progressing"]["status"], conds["Progressing"]["reason"]) == (
        "True",
        "ComponentsStarting",
    )
    assert conds["Ready"]["reason"] == "ComponentsStarting"

    was_ready = status.compute(_ok(), None, generation=1, now=NOW)
    lost = status.compute(
        _ok(environment=status.Workload(exists=True, desired=2, ready=1)), was_ready, 1, LATER
    )
    conds = _conds(lost)
    assert conds["EnvironmentReady"]["reason"] == "ReplicasUnavailable"
    assert conds["Degraded"]["status"] == "True"
    assert conds["Degraded"]["reason"] == "ReplicasUnavailable"
    assert "1/2 environment pods ready (it was ready)" in conds["Degraded"]["message"]
    still = status.compute(
        _ok(environment=status.Workload(exists=True, desired=2, ready=0)), lost, 1, LATER
    )
    assert _conds(still)["Degraded"]["status"] == "True"  # it stays degraded until it recovers


def test_pod_problems_explain_what_is_wrong():
    pod = {
        "metadata": {"name": "demo-rollout-x"},
        "status": {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                }
            ],
            "containerStatuses": [
                {
                    "name": "rollout",
                    "state": {"waiting": {"reason": "ImagePullBackOff"}},
                    "lastState": {},
                }
            ],
        },
    }
    problems = status.pod_problems(pod)
    assert problems[0] == (
        "Unschedulable",
        "pod demo-rollout-x cannot be scheduled: 0/3 nodes are available: 3 Insufficient "
        "nvidia.com/gpu.",
    )
    assert problems[1][0] == "ImagePullBackOff"
    obs = _ok(rollout=status.Workload(exists=True, desired=1, ready=0, problems=tuple(problems)))
    conds = _conds(status.compute(obs, None, 1, NOW))
    assert conds["RolloutReady"]["reason"] == "Unschedulable"
    assert conds["Degraded"]["reason"] == "Unschedulable"
    assert "ImagePullBackOff" in conds["Degraded"]["message"]


def test_a_pod_that_refuses_to_start_without_its_rdma_device_says_so(tmp_path):
    from aflowrl.common import rdma
    from aflowrl.errors import FailedPreconditionError

    with pytest.raises(FailedPreconditionError) as refused:  # what `aflowrl serve` stops with
        rdma.check(1, root=tmp_path)
    pod = {
        "metadata": {"name": "demo-learner-0"},
        "status": {
            "containerStatuses": [
                {
                    "name": "learner",
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                    "lastState": {
                        "terminated": {
                            "reason": "Error",
                            "exitCode": 1,
                            "message": str(refused.value),
                        }
                    },
                }
            ]
        },
    }
    problems = status.pod_problems(pod)
    assert [reason for reason, _ in problems] == ["RdmaUnavailable"]
    assert "resources.rdma=1" in problems[0][1] and "demo-learner-0" in problems[0][1]
    crashing = {**pod["status"]["containerStatuses"][0], "lastState": {}}
    plain = status.pod_problems({**pod, "status": {"containerStatuses": [crashing]}})
    assert [reason for reason, _ in plain] == ["CrashLoopBackOff"]
    obs = _ok(learner=status.Workload(exists=True, desired=1, ready=0, problems=tuple(problems)))
    conds = _conds(status.compute(obs, None, 1, NOW))
    assert conds["Degraded"]["reason"] == "RdmaUnavailable"
    assert conds["LearnerReady"]["reason"] == "RdmaUnavailable"


def test_finished_runs_report_success_or_failure():
    done = _ok(
        trainer=status.job_state(
            {
                "spec": {},
                "status": {
                    "succeeded": 1,
                    "completionTime": LATER,
                    "conditions": [{"type": "Complete", "status": "True"}],
                },
            }
        )
    )
    conds = _conds(out := status.compute(done, {"iteration": 20}, 2, LATER))
    assert (conds["Succeeded"]["status"], conds["Failed"]["status"]) == ("True", "False")
    assert conds["Ready"]["reason"] == "Completed" and conds["Progressing"]["status"] == "False"
    assert conds["RolloutReady"]["reason"] == "RunFinished"
    assert out["completionTime"] == LATER

    failed_job = {
        "spec": {},
        "status": {
            "failed": 11,
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": "Job has reached the specified backoff limit",
                    "lastTransitionTime": LATER,
                }
            ],
        },
    }
    failed = _ok(trainer=status.job_state(failed_job))
    conds = _conds(out := status.compute(failed, None, 2, LATER))
    assert conds["Failed"]["status"] == "True" and conds["Succeeded"]["status"] == "False"
    assert conds["Failed"]["message"] == (
        "BackoffLimitExceeded: Job has reached the specified backoff limit"
    )
    assert conds["Ready"]["reason"] == "TrainerFailed"
    assert out["completionTime"] == LATER


def test_suspended_and_rejected_runs():
    conds = _conds(status.compute(_ok(suspended=True), None, 1, NOW))
    assert conds["Ready"]["reason"] == "Suspended" and conds["Degraded"]["status"] == "False"
    assert conds["TrainerRunning"]["reason"] == "Suspended"

    invalid = status.Observation(spec=None, rejection=Rejection("InvalidSpec", ("spec.a: bad",)))
    conds = _conds(out := status.compute(invalid, None, 1, NOW))
    assert conds["Ready"]["reason"] == "InvalidSpec" and conds["Ready"]["message"] == "spec.a: bad"
    assert conds["Degraded"]["reason"] == "InvalidSpec"
    assert out["totalIterations"] is None

    immutable = _ok(rejection=Rejection("ImmutableFieldChanged", ("spec.policy.model: no",)))
    conds = _conds(status.compute(immutable, None, 1, NOW))
    assert conds["Ready"]["status"] == "True"  # the accepted spec keeps training
    assert conds["Degraded"]["reason"] == "ImmutableFieldChanged"


def test_only_changes_are_written():
    out = status.compute(_ok(), None, 1, NOW)
    assert status.changed(out, None)
    assert not status.changed(out, {**out, "iteration": 5, "bestScore": 0.5})
    assert status.changed(out, {**out, "observedGeneration": 0})


# ---- GPU capacity ----------------------------------------------------------------------------


def _node(name: str, gpus: str, labels: dict | None = None, unschedulable: bool = False) -> dict:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"unschedulable": unschedulable},
        "status": {"allocatable": {"nvidia.com/gpu": gpus}},
    }


def test_gpu_requests_larger_than_every_node_are_reported_with_the_numbers():
    spec = RunSpec.from_document(
        {
            "learner": {"procsPerNode": 8, "resources": {"gpus": 8}},
            "rollout": {"resources": {"gpus": 2}},
        }
    )
    nodes = [_node("a", "4"), _node("b", "2"), _node("c", "8", unschedulable=True)]
    (line,) = capacity.unschedulable(spec, nodes)
    assert line == (
        "learner pods ask for 8 nvidia.com/gpu each, but the largest node offers 4 (a: 4, b: 2)"
    )
    assert capacity.unschedulable(spec, [*nodes, _node("d", "8")]) == []
    assert capacity.unschedulable(spec, []) == []  # nodes cannot be listed: no claim


def test_the_node_selector_limits_the_candidates():
    spec = RunSpec.from_document(
        {"rollout": {"resources": {"gpus": 2}}, "scheduling": {"nodeSelector": {"pool": "gpu"}}}
    )
    assert capacity.unschedulable(spec, [_node("a", "8")]) == [
        "rollout pods ask for 2 nvidia.com/gpu each, but no schedulable node matching "
        "nodeSelector {'pool': 'gpu'} exists (1 nodes checked)"
    ]
    assert capacity.unschedulable(spec, [_node("a", "8", {"pool": "gpu"})]) == []


@pytest.mark.parametrize("served", [False, True])
def test_the_served_executor_counts_as_a_gpu_component(served):
    executor = {"type": "openai", "serve": {"model": "/m"}} if served else {"type": "surrogate"}
    spec = RunSpec.from_document({"environment": {"executor": executor}})
    names = [name for name, _ in capacity.gpu_components(spec)]
    assert names == (["executor"] if served else [])


# ---- failure forensics -----------------------------------------------------------------------


def _failed_pod(name: str, component: str, finished: str, *, last: bool = False) -> dict:
    ended = {
        "exitCode": 137 if component == "learner" else 1,
        "reason": "OOMKilled" if component == "learner" else "Error",
        "message": "step 3\nstep 4\nRuntimeError: rendezvous closed\n",
        "finishedAt": finished,
    }
    state = (
        {"lastState": {"terminated": ended}, "state": {"running": {}}}
        if last
        else {"state": {"terminated": ended}}
    )
    return {
        "metadata": {"name": name, "labels": {"app.kubernetes.io/component": component}},
        "status": {"containerStatuses": [{"name": component, **state}]},
    }


def test_the_last_error_is_the_newest_failed_exit_with_its_log_lines():
    pods = [
        _failed_pod("demo-trainer-a", "trainer", NOW),
        _failed_pod("demo-learner-0", "learner", LATER, last=True),  # restarted since
        _failed_pod("ok", "environment", "2027-01-01T00:00:00Z"),
    ]
    pods[2]["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] = 0  # a success
    error = status.last_error(pods, status.TrainerJob(), None)
    assert error == {
        "component": "learner",
        "pod": "demo-learner-0",
        "container": "learner",
        "reason": "OOMKilled",
        "exitCode": 137,
        "message": "step 3\nstep 4\nRuntimeError: rendezvous closed\n",
        "time": LATER,
    }
    # It fits the CRD's status schema, and outlives the pods until something newer fails.
    TrainingRunStatus.model_validate({"lastError": error})
    assert status.last_error([], status.TrainerJob(), error) == error
    assert status.last_error(pods[:1], status.TrainerJob(), error) == error
    out = status.compute(_ok(last_error=error), None, 1, LATER)
    assert out["lastError"] == error


def test_a_long_termination_message_keeps_its_end():
    pod = _failed_pod("p", "trainer", NOW)
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = "x" * 9000 + "END"
    error = status.last_error([pod], status.TrainerJob(), None)
    assert error is not None
    assert len(error["message"]) == 4096 and error["message"].endswith("END")


def test_a_job_failure_without_a_pod_exit_is_the_last_error():
    deadline = status.job_state(
        {
            "spec": {},
            "status": {
                "conditions": [
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "DeadlineExceeded",
                        "message": "Job was active longer than specified deadline",
                        "lastTransitionTime": LATER,
                    }
                ]
            },
        }
    )
    error = status.last_error([], deadline, None)
    assert error == {
        "component": "trainer",
        "reason": "DeadlineExceeded",
        "message": "Job was active longer than specified deadline",
        "time": LATER,
    }
    # A trainer exit explains the failure better than the Job's summary.
    crashed = status.last_error([_failed_pod("t", "trainer", NOW)], deadline, None)
    assert crashed is not None and crashed["reason"] == "Error"


def test_every_condition_change_is_an_event_and_problems_are_warnings():
    running = status.compute(_ok(), None, 1, NOW)
    assert status.transitions(running, running) == []
    # A first status: only its problems are news.
    assert status.transitions(None, running) == []
    down = status.compute(
        _ok(environment=status.Workload(exists=True, desired=2, ready=1)), running, 1, LATER
    )
    events = status.transitions(running, down)
    by_reason = {(t, r) for t, r, _ in events}
    assert ("Warning", "ReplicasUnavailable") in by_reason
    degraded = [m for _, _, m in events if m.startswith("Degraded is True")]
    assert degraded and "1/2 environment pods ready" in degraded[0]
    back = status.compute(_ok(), down, 1, LATER)
    assert ("Normal", "AsExpected") in {(t, r) for t, r, _ in status.transitions(down, back)}

    crash = _failed_pod("demo-trainer-a", "trainer", NOW)
    error = status.last_error([crash], status.TrainerJob(), None)
    failed = status.compute(_ok(last_error=error), running, 1, LATER)
    (news,) = [e for e in status.transitions(running, failed) if e[1] == "ComponentFailed"]
    assert news[0] == "Warning"
    assert news[2] == (
        "trainer pod demo-trainer-a container trainer: Error (exit code 1): "
        "step 3 | step 4 | RuntimeError: rendezvous closed"
    )
    assert [e for e in status.transitions(failed, failed) if e[1] == "ComponentFailed"] == []


def test_a_kueue_eviction_is_its_own_reason_and_a_warning():
    queued = status.compute(_ok(queued="waiting for Kueue"), None, 1, NOW)
    evicted = status.compute(
        _ok(queued="evicted by Kueue: preempted", evicted=True), queued, 1, LATER
    )
    assert _conds(evicted)["Ready"]["reason"] == "Evicted"
    assert ("Warning", "Evicted") in {(t, r) for t, r, _ in status.transitions(queued, evicted)}
    assert _conds(queued)["Ready"]["reason"] == "Queued"


def test_the_admitted_condition_reports_kueue_and_only_ready_warns():
    plain = status.compute(_ok(), None, 1, NOW)
    assert (_conds(plain)["Admitted"]["status"], _conds(plain)["Admitted"]["reason"]) == (
        "True",
        "NotQueued",
    )
    queued = status.compute(
        _ok(queued="waiting", admission=(False, "Queued", "waiting")), None, 1, NOW
    )
    admitted = status.compute(
        _ok(admission=(True, "Admitted", "admitted by Kueue on flavors h100")), queued, 1, LATER
    )
    assert ("Normal", "Admitted") in {(t, r) for t, r, _ in status.transitions(queued, admitted)}
    deactivated = status.compute(
        _ok(
            queued="deactivated by Kueue",
            deactivated=True,
            admission=(False, "Deactivated", "deactivated by Kueue"),
        ),
        admitted,
        1,
        LATER,
    )
    assert _conds(deactivated)["Ready"]["reason"] == "Deactivated"
    events = [(t, r, m) for t, r, m in status.transitions(admitted, deactivated)]
    kinds = {(t, m.split(" ", 1)[0]) for t, r, m in events if r == "Deactivated"}
    assert kinds == {("Warning", "Ready"), ("Warning", "Progressing"), ("Normal", "Admitted")}


def test_a_pod_stopped_by_a_scale_down_is_no_error():
    pod = _failed_pod("demo-learner-0", "learner", NOW)
    pod["metadata"]["deletionTimestamp"] = NOW
    assert status.last_error([pod], status.TrainerJob(), None) is None
