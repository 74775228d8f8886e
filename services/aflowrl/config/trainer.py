"""The trainer: the RL loop driving the three services."""

from __future__ import annotations

from pydantic import Field

from aflowrl.config._base import SpecModel
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


class TrainerSpec(SpecModel):
    """Iterations, batch shape, seeding and checkpoints of the RL loop."""

    iterations: int = Field(default=20, ge=1, le=1_000_000)
    """Training iterations (one rollout batch and one policy update each)."""
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
    checkpoint_dir: str = Field(default="/checkpoints", min_length=1, max_length=4096)
    """Where checkpoints and the run's artifacts are written (a volume on Kubernetes)."""
    off_policy: OffPolicySpec = Field(default_factory=OffPolicySpec)
    """Rollout/update overlap."""
    step_timeout_s: float = Field(default=1800.0, gt=0.0, le=86400.0)
    """Deadline of one environment Step call (seconds); evaluation dominates it."""
    final_test_eval: bool = True
    """At the end, evaluate the best workflow, the seed and the classic baselines on the test
    split."""
    resources: ResourceSpec = Field(default_factory=lambda: ResourceSpec(cpu="1", memory="2Gi"))
    """Resources of the trainer pod."""
    pod: PodOverrides = Field(default_factory=PodOverrides)
    """Labels, annotations and placement of the trainer pod."""
