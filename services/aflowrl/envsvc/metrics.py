"""Prometheus metrics of the environment service (evaluation, cache, executor, sandbox, steps).

The service records into these objects; the Grafana dashboard reads exactly these names
(``tests/`` check that every name the dashboard uses is exported by one of the components).
The workflow evaluator records evaluations, cache lookups, executor calls and sandbox runs
(:class:`aflowrl.workflow.Evaluator` takes this object); the service records steps, resets and
state blobs. The cache hit ratio is computed from the hit and miss counters when scraped, so it
is the replica's whatever number of evaluators share them.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter

from aflowrl.common.metrics import ComponentMetrics


class EnvironmentMetrics(ComponentMetrics):
    """Metrics of one environment replica."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, benchmarks: Sequence[str] = ()
    ) -> None:
        """``benchmarks``: the benchmarks whose series exist from the start (those served)."""
        super().__init__("environment", registry)
        self.evaluations = self.counter(
            "evaluations_total", "Workflow evaluations finished.", ["benchmark"]
        )
        self.evaluation_duration = self.histogram(
            "evaluation_duration_seconds", "Wall time of one workflow evaluation.", ["benchmark"]
        )
        self.problem_runs = self.counter(
            "problem_runs_total", "Workflow runs on one problem (cached or not).", ["benchmark"]
        )
        for benchmark in benchmarks:  # zero series from the start: the first evaluation is a rate
            self.evaluations.labels(benchmark)
            self.evaluation_duration.labels(benchmark)
            self.problem_runs.labels(benchmark)
        self.cache_hits = self.counter("cache_hits_total", "Problem runs answered by the cache.")
        self.cache_misses = self.counter("cache_misses_total", "Problem runs computed.")
        self.cache_hit_ratio = self.gauge(
            "cache_hit_ratio", "Share of problem runs answered by the cache since start."
        )
        self.executor_requests = self.counter(
            "executor_requests_total", "Executor LLM calls, by outcome.", ["outcome"]
        )
        self.executor_tokens = self.counter(
            "executor_tokens_total", "Executor LLM tokens, by kind (prompt, completion).", ["kind"]
        )
        self.executor_cost = self.counter(
            "executor_cost_usd_total", "Executor cost in USD (known prices)."
        )
        self.executor_unpriced_requests = self.counter(
            "executor_unpriced_requests_total", "Executor calls whose model has no known price."
        )
        self.executor_latency = self.histogram(
            "executor_request_duration_seconds", "Executor LLM call latency."
        )
        self.sandbox_runs = self.counter(
            "sandbox_runs_total",
            "Sandboxed code runs, by status (ok, error, timeout, killed).",
            ["status"],
        )
        self.steps = self.counter(
            "steps_total", "Environment steps, by validity of the action.", ["valid"]
        )
        self.step_duration = self.histogram("step_duration_seconds", "Wall time of one Step call.")
        self.resets = self.counter("resets_total", "Episodes started.", ["task"])
        # Zero series from the start for the labels every run has, so that a rate over the
        # first observations is a number however late the first scrape after them comes.
        self.executor_requests.labels("ok")
        for kind in ("prompt", "completion"):
            self.executor_tokens.labels(kind)
        for status in ("ok", "error", "timeout", "killed"):
            self.sandbox_runs.labels(status)
        for valid in ("true", "false"):
            self.steps.labels(valid)
        self.state_size = self.histogram(
            "state_size_bytes",
            "Size of the state blobs returned by Reset and Step.",
            buckets=tuple(float(1 << k) for k in range(10, 23)),
        )
        self.rejected_states = self.counter(
            "rejected_states_total", "State blobs refused (corrupt, truncated, foreign...)."
        )
        self.cache_hit_ratio.set_function(self._hit_ratio)

    def cache_totals(self) -> tuple[int, int]:
        """Problem runs answered by the cache and computed, since start."""
        return int(_total(self.cache_hits)), int(_total(self.cache_misses))

    def _hit_ratio(self) -> float:
        hits, misses = self.cache_totals()
        return hits / (hits + misses) if hits + misses else 0.0


def _total(counter: Counter) -> float:
    """The value of an unlabelled counter (through the public collector interface)."""
    return sum(
        sample.value
        for family in counter.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    )
