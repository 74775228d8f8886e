"""The trainer: the RL loop driving the three services."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from aflowrl.config._base import CelRule, FieldRuleError, FsPath, SpecModel
from aflowrl.config.resources import ResourceSpec
from aflowrl.config.scheduling import PodOverrides


class OffPolicySpec(SpecModel):
    """One-step off-policy overlap: the next rollout runs during the current update."""

    enabled: bool = False
    """Overlap rollout and training (faster; actions come from a slightly stale policy)."""
    max_staleness: int = Field(default=1, ge=1, le=8)
    """Most policy versions a training row may lag behind (older rows are dropped)."""
    importance_weight_cap: float = Field(default=2.0, ge=1.0, le=100.0)
    """Truncation C of the importance weight min(pi_old / pi_behaviour, C) that corrects the
    advantages of rows sampled by an older policy version (decoupled PPO)."""


class WarmStartSpec(SpecModel):
    """Supervised warm start before RL, from search traces the environment produces: a
    behaviour policy plays ``episodes`` episodes and, at every state it visits, every listed
    action is stepped from that same state, so each candidate's reward is known. The policy is
    trained towards softmax(reward / temperature) over each state's candidates (its value
    towards the expected reward under that target), then RL starts from those weights."""

    episodes: int = Field(default=0, ge=0, le=1_000_000)
    """Behaviour episodes to label (0: no warm start). Each is its own task."""
    behaviour: Literal["uniform", "policy"] = "uniform"
    """Who plays the labelled episodes: uniform over the admissible actions, or the policy."""
    temperature: float = Field(default=0.02, gt=0.0, le=10.0)
    """tau of the target softmax over the candidates' rewards (reward units: score changes)."""
    epochs: int = Field(default=3, ge=1, le=1000)
    """Passes over the labelled states (mini-batches of ``learner.loss.miniBatchSize``)."""
    lr: float | None = Field(default=None, gt=0.0, le=1.0)
    """Peak learning rate of the warm start's updates (the learner's warmup and schedule
    apply); null: ``learner.optimizer.lr``. Supervised targets are full-information and
    low-noise, so the warm start can take steps that would wreck an RL update: a run that
    warm-starts a small policy typically sets this 5-10x above the RL learning rate."""
    value_loss_coef: float | None = Field(default=None, ge=0.0, le=100.0)
    """Weight of the value replies' cross-entropy in the warm start's updates; null:
    ``policy.value.lossCoef``. The warm start is where V(s) learns most (a target for every
    labelled state), while in RL updates the same loss competes with a weak policy gradient,
    so a small policy may want it high here and low in ``policy.value.lossCoef``."""
    keep_optimizer_state: bool = False
    """Carry the warm start's AdamW moments and step count into RL. False (the default): the
    first RL update starts a fresh optimiser (zero moments, the warm-up from step 0), since the
    supervised phase's second moments, sized to its larger gradients, would shrink every RL
    step."""
    validation_episodes: int = Field(default=0, ge=0, le=100_000)
    """Behaviour episodes labelled like the others but never trained on (tasks from the held-out
    problem pool, ``environment.evaluation.pools``): after every epoch the warm start reports
    its fit on their states (``warmstart/val_*``: cross-entropy to the targets, the share of
    states where the policy's top action is a best one, and the expected reward of the policy's
    distribution against the best and the uniform one)."""


class TrainerSpec(SpecModel):
    """Iterations, batch shape, seeding and checkpoints of the RL loop."""

    iterations: int = Field(default=20, ge=0, le=1_000_000)
    """Training iterations (one rollout batch and one policy update each); 0 runs only the warm
    start (if any) and the final evaluation."""
    tasks_per_iteration: int = Field(default=2, ge=1, le=4096)
    """B: distinct episode seeds per iteration."""
    group_size: int = Field(default=4, ge=1, le=1024)
    """n: episodes per seed (the GiGPO / GRPO group)."""
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    """Seed of everything random in the run."""
    checkpoint_every: int = Field(default=5, ge=0, le=1_000_000)
    """Save a checkpoint every K iterations (0: only at the end)."""
    keep_checkpoints: int = Field(default=3, ge=1, le=1000)
    """Checkpoints kept on disk (the oldest are deleted)."""
    checkpoint_dir: FsPath = "/checkpoints"
    """Where checkpoints and the run's artifacts are written (a volume on Kubernetes)."""
    off_policy: OffPolicySpec = Field(default_factory=OffPolicySpec)
    """Rollout/update overlap."""
    warm_start: WarmStartSpec = Field(default_factory=WarmStartSpec)
    """Supervised warm start from labelled search traces, before the RL iterations."""
    step_timeout_s: float = Field(default=1800.0, gt=0.0, le=86400.0)
    """Deadline of one environment Step call (seconds); evaluation dominates it."""
    final_test_eval: bool = True
    """At the end, evaluate the best workflow, the seed and the classic baselines on the test
    split."""
    resources: ResourceSpec = Field(default_factory=lambda: ResourceSpec(cpu="1", memory="2Gi"))
    """Resources of the trainer pod."""
    pod: PodOverrides = Field(default_factory=PodOverrides)
    """Labels, annotations and placement of the trainer pod."""
    active_deadline_seconds: int | None = Field(default=None, ge=1, le=31_536_000)
    """Most seconds the trainer may run (the Job's ``activeDeadlineSeconds``), at most a year:
    past it Kubernetes stops the trainer and the run fails with reason ``DeadlineExceeded``.
    Counted from the Job's start, and from zero again after a suspend. null: no limit."""
    keep_pods_after_end: bool = False
    """Keep the rollout, learner, environment and executor pods running after the trainer ends
    (succeeded or failed), so ``kubectl logs`` and ``kubectl exec`` still reach them; they hold
    their resources (GPUs included) meanwhile. False: they are scaled to zero at the end. The
    trainer's own pods stay either way (a finished Job keeps its pods)."""
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0, le=2_592_000)
    """With ``keepPodsAfterEnd``: seconds after the run's completion time before the kept pods
    are scaled to zero (at most 30 days; applied by the next operator pass, so up to one resync
    interval late). null: kept until the run is suspended or deleted."""

    cel_rules = (
        CelRule(
            "!{?ttlSecondsAfterFinished} || {keepPodsAfterEnd}",
            "ttlSecondsAfterFinished applies only with keepPodsAfterEnd: true",
            "ttlSecondsAfterFinished",
        ),
    )

    @model_validator(mode="after")
    def _ttl_needs_keep(self) -> TrainerSpec:
        if self.ttl_seconds_after_finished is not None and not self.keep_pods_after_end:
            raise FieldRuleError(
                "ttlSecondsAfterFinished",
                f"ttlSecondsAfterFinished={self.ttl_seconds_after_finished} applies only with "
                "keepPodsAfterEnd: true (without it the pods are scaled to zero at the end)",
            )
        return self
