"""Prometheus metrics of the learner service (losses, KL, entropy, step time, checkpoints)."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from aflowrl.common.metrics import ComponentMetrics


class LearnerMetrics(ComponentMetrics):
    """Metrics of the learner (rank 0)."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, transports: Sequence[str] = ()
    ) -> None:
        """``transports``: the weight transports whose series exist from the start (the run's)."""
        super().__init__("learner", registry)
        self.policy_loss = self.gauge("policy_loss", "Policy-gradient loss of the last Train.")
        self.value_loss = self.gauge("value_loss", "Critic loss of the last Train (PPO).")
        self.kl = self.gauge("reference_kl", "KL to the reference policy in the last Train.")
        self.approx_kl = self.gauge("approx_kl", "Approximate KL between old and new policy.")
        self.entropy = self.gauge("policy_entropy", "Mean token entropy in the last Train.")
        self.clipfrac = self.gauge("clipfrac_ratio", "Share of tokens whose ratio was clipped.")
        self.grad_norm = self.gauge("grad_norm", "Global gradient norm before clipping.")
        self.update_kl = self.gauge(
            "update_kl",
            "KL(pi_old || pi) of the last Train's batch after the update (exact over a choice's "
            "candidates): how far the update moved the policy.",
        )
        self.update_tv = self.gauge(
            "update_tv_ratio", "Total variation between the batch's old and updated policy."
        )
        self.start_kl = self.gauge(
            "start_kl",
            "KL(pi || pi_ref) of the last Train's batch, from the reference: the policy RL "
            "started from.",
        )
        self.start_tv = self.gauge(
            "start_tv_ratio", "Total variation of the policy from the one RL started from."
        )
        self.param_distance = self.gauge(
            "param_distance_ratio",
            "||theta - theta_ref|| / ||theta_ref||: the weights' distance from the reference.",
        )
        self.learning_rate = self.gauge("learning_rate_ratio", "Current learning rate.")
        self.train_duration = self.histogram(
            "train_step_duration_seconds", "Wall time of one Train call."
        )
        self.tokens_per_second = self.gauge(
            "train_tokens_per_second", "Tokens processed per second in the last Train."
        )
        self.trained_tokens = self.counter("trained_tokens_total", "Tokens trained on.")
        self.policy_version = self.gauge("policy_version", "Policy version after the last Train.")
        self.logprob_duration = self.histogram(
            "logprob_duration_seconds", "Wall time of one ComputeLogProbs call.", ["model"]
        )
        self.weight_push_duration = self.histogram(
            "weight_push_duration_seconds",
            "Wall time of streaming or exporting weights.",
            ["transport"],
        )
        for transport in transports:  # zero series from the start: the first push is a rate
            self.weight_push_duration.labels(transport)
        self.checkpoint_duration = self.histogram(
            "checkpoint_duration_seconds", "Wall time of saving or loading a checkpoint.", ["op"]
        )
