"""``TrainingRun.status``: what the operator and the trainer report about a run.

Status follows the Kubernetes API conventions: ``conditions`` are the source of truth (no phase
enum), each with a CamelCase ``reason`` and a readable ``message``; ``observedGeneration`` says
which spec generation the status describes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from aflowrl.config._base import SpecModel

CONDITION_TYPES: tuple[str, ...] = (
    "Ready",
    "Progressing",
    "Degraded",
    "Succeeded",
    "Failed",
    "RolloutReady",
    "LearnerReady",
    "EnvironmentReady",
    "TrainerRunning",
    "Admitted",
)
"""Every condition type a TrainingRun reports (``Admitted``: Kueue's admission of a queued run;
True with reason ``NotQueued`` for a run that is not queued)."""


class Condition(SpecModel):
    """One aspect of the run's state (Kubernetes ``metav1.Condition``)."""

    type: str = Field(min_length=1, max_length=316)
    """Condition type, one of Ready, Progressing, Degraded, Succeeded, Failed, RolloutReady,
    LearnerReady, EnvironmentReady, TrainerRunning, Admitted."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    """CamelCase reason for the last transition (e.g. "AllReplicasReady", "Unschedulable")."""
    message: str = Field(default="", max_length=32768)
    """Human-readable details."""
    last_transition_time: str
    """When the status last changed (RFC 3339)."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The spec generation the condition was computed from."""


class LastError(SpecModel):
    """The last failure of one of the run's containers (or of the trainer Job), for the reader
    who finds a failed run after its pods are gone."""

    component: str = Field(min_length=1, max_length=63)
    """Which part failed: rollout, learner, environment, executor or trainer."""
    pod: str | None = Field(default=None, max_length=253)
    """The pod whose container terminated (null: the Job failed without a pod's exit, e.g.
    ``DeadlineExceeded``)."""
    container: str | None = Field(default=None, max_length=63)
    """The container that terminated."""
    reason: str = Field(min_length=1, max_length=1024)
    """Why it ended: the container's termination reason (``Error``, ``OOMKilled``...) or the
    Job's failure reason (``BackoffLimitExceeded``, ``DeadlineExceeded``)."""
    exit_code: int | None = Field(default=None, ge=-(2**31), le=2**31 - 1)
    """The container's exit code (null for a Job failure)."""
    message: str = Field(default="", max_length=4096)
    """The container's termination message: with ``FallbackToLogsOnError``, the last lines of
    its log when it wrote no message (at most 4096 characters, the end kept)."""
    time: str | None = None
    """When it ended (RFC 3339)."""


class TrainingRunStatus(SpecModel):
    """Observed state of a TrainingRun."""

    observed_generation: int | None = Field(default=None, ge=0)
    """The spec generation the operator last reconciled."""
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=32,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """Current conditions (one per type: a list-map keyed by ``type``, so server-side apply
    merges them by type)."""
    iteration: int | None = Field(default=None, ge=0)
    """Training iterations completed."""
    total_iterations: int | None = Field(default=None, ge=0)
    """Iterations the run will perform (spec.trainer.iterations)."""
    best_score: float | None = None
    """Best validation score of any workflow found, in [0, 1] (with several training
    benchmarks, the mean of each benchmark's best)."""
    seed_score: float | None = None
    """Validation score of the seed workflow, in [0, 1]."""
    mean_reward: float | None = None
    """Mean episode return of the last iteration."""
    valid_action_ratio: float | None = Field(default=None, ge=0.0, le=1.0)
    """Share of valid actions in the last iteration."""
    policy_version: int | None = Field(default=None, ge=0)
    """Weight version the rollout serves."""
    start_time: str | None = None
    """When the trainer started (RFC 3339)."""
    completion_time: str | None = None
    """When the run succeeded or failed (RFC 3339)."""
    rollout_ready_replicas: int | None = Field(default=None, ge=0)
    """Ready rollout pods."""
    learner_ready_replicas: int | None = Field(default=None, ge=0)
    """Ready learner pods."""
    environment_ready_replicas: int | None = Field(default=None, ge=0)
    """Ready environment pods."""
    best_workflow: str | None = Field(default=None, max_length=262144)
    """Canonical hash of the best workflow found (runs on one benchmark)."""
    last_error: LastError | None = None
    """The most recent failure of a container of the run (kept until a later one replaces it)."""
