"""Prometheus metrics of the trainer (reward, best score, valid actions, phase timings).

The trainer also writes the same scalars to ``metrics.jsonl`` under namespaced keys
(``charts/reward``...); these gauges are what Grafana shows for a cluster run.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from aflowrl.common.metrics import ComponentMetrics

PHASES = ("reset", "generate", "step", "advantage", "logprob", "train", "weight_sync", "checkpoint")
"""Phases of an iteration, the ``phase`` label of the timing metrics."""


class TrainerMetrics(ComponentMetrics):
    """Metrics of the RL loop."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__("trainer", registry)
        self.iteration = self.gauge("current_iteration", "Training iterations completed.")
        self.mean_reward = self.gauge(
            "episode_reward", "Mean episode return of the last iteration."
        )
        self.best_score = self.gauge(
            "best_score",
            "Best validation score of any workflow found (several benchmarks: the mean of each "
            "benchmark's best).",
        )
        self.benchmark_episode_reward = self.gauge(
            "benchmark_episode_reward",
            "Mean episode return of the last iteration's episodes on a benchmark.",
            ["benchmark"],
        )
        self.benchmark_best_score = self.gauge(
            "benchmark_best_score",
            "Best validation score of any workflow found on a benchmark.",
            ["benchmark"],
        )
        self.iteration_best_score = self.gauge(
            "iteration_best_score", "Best validation score found in the last iteration."
        )
        self.valid_action_ratio = self.gauge(
            "valid_action_ratio", "Share of valid actions in the last iteration."
        )
        self.phase_duration = self.histogram(
            "phase_duration_seconds", "Wall time of each phase of an iteration.", ["phase"]
        )
        for phase in PHASES:  # zero series from the start: the first iteration is a rate
            self.phase_duration.labels(phase)
        self.iteration_duration = self.histogram(
            "iteration_duration_seconds", "Wall time of one iteration."
        )
        self.overhead = self.gauge(
            "overhead_ratio", "Share of the last iteration spent outside service calls."
        )
        self.policy_version = self.gauge("policy_version", "Policy version the rollout serves.")
        self.advantage_std = self.gauge(
            "sampled_std_advantage",
            "Standard deviation of the last iteration's advantages on the sampled actions (the "
            "scale an update works with).",
        )
        self.candidate_advantage_std = self.gauge(
            "candidate_std_advantage",
            "Standard deviation of the last iteration's per-candidate advantages (GiGPO's "
            "sibling step groups).",
        )
        self.sibling_executor_calls = self.counter(
            "sibling_executor_calls_total",
            "Executor calls made by the Steps of sibling actions (GiGPO's sibling step groups).",
        )
        self.episodes = self.counter("episodes_total", "Episodes finished.")
        self.reward_noise_sd = self.gauge(
            "noise_std_reward",
            "Executor-sample noise sd of one step reward in the last iteration (pairs of "
            "readings on other sample indices, environment.evaluation.resampleFraction).",
        )
        self.reward_signal_to_noise = self.gauge(
            "reward_signal_to_noise_ratio",
            "The step rewards' true-part sd over their noise sd in the last iteration.",
        )
        self.resampled_steps = self.counter(
            "resampled_steps_total",
            "Step rewards the environment measured twice (on other executor sample indices).",
        )
