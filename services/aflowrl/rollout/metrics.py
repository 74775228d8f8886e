"""Prometheus metrics of the rollout service (generation throughput, queue, weight updates)."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from aflowrl.common.metrics import ComponentMetrics

REFUSAL_REASONS = (
    "stale",
    "partial",
    "corrupt",
    "mismatch",
    "broken",
    "interrupted",
    "load_failed",
)
"""The ``reason`` label of ``weight_updates_refused_total`` (see the servicer's ``_refused``)."""


class RolloutMetrics(ComponentMetrics):
    """Metrics of one rollout replica."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, transports: Sequence[str] = ()
    ) -> None:
        """``transports``: the weight transports whose series exist from the start (the run's)."""
        super().__init__("rollout", registry)
        self.generated_tokens = self.counter("generated_tokens_total", "Tokens generated.")
        self.prompt_tokens = self.counter("prompt_tokens_total", "Prompt tokens processed.")
        self.sequences = self.counter("sequences_total", "Completions generated.")
        self.queued = self.gauge("queued_requests", "Generate calls waiting for the engine.")
        self.running = self.gauge("running_requests", "Generate calls being served.")
        self.generate_duration = self.histogram(
            "generate_duration_seconds", "Wall time of one Generate call."
        )
        self.throughput = self.gauge(
            "generation_tokens_per_second", "Tokens per second of the last Generate call."
        )
        self.weight_version = self.gauge("weight_version", "Policy weight version being served.")
        self.weight_update_duration = self.histogram(
            "weight_update_duration_seconds",
            "First byte to swap of a weight update.",
            ["transport"],
        )
        self.weight_update_bytes = self.counter(
            "weight_update_bytes_total", "Bytes of weights received or loaded.", ["transport"]
        )
        self.weight_updates_refused = self.counter(
            "weight_updates_refused_total",
            "Weight updates refused (stale, partial, corrupt, mismatch, broken, interrupted) "
            "or that failed while loading (load_failed).",
            ["reason"],
        )
        for reason in REFUSAL_REASONS:  # zero series from the start: a refusal rate exists
            self.weight_updates_refused.labels(reason)
        for transport in transports:  # zero series from the start: the first update is a rate
            self.weight_update_duration.labels(transport)
            self.weight_update_bytes.labels(transport)
        self.weight_update_buckets = self.counter(
            "weight_update_buckets_total",
            "Pieces of weights loaded into the engine (reload calls; broadcast buckets handed to"
            " the model, counted when the broadcast ends, none for a refused one).",
            ["transport"],
        )
        self.weight_updates_running = self.gauge(
            "weight_updates_running_requests",
            "Weight updates being applied now (requests wait at the swap gate meanwhile).",
        )
        self.weights_incomplete = self.gauge(
            "weights_incomplete_replicas",
            "1 while a broken broadcast left this replica's weights incomplete (requests "
            "refused until a reload); summed over replicas, how many wait for one.",
        )
