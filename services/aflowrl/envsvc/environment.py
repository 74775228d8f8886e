"""One environment replica's domain object: the search over its benchmarks, with one cache.

:class:`Environment` holds what every call needs and nothing per episode: the benchmarks it
serves (:class:`ServedBenchmark`: the scorer and the loaded splits of each: the run's training
and held-out benchmarks), one executor and one evaluation cache shared by all of them, the
evaluators (one per benchmark and evaluation seed), a search context per benchmark, the state
codec and the metrics. A call is dispatched on its benchmark: ``Reset`` on ``task``,
``Evaluate`` on ``benchmark``, ``Step`` and ``Project`` on the benchmark the episode state
names, so one replica serves episodes of every benchmark and any replica serves any call. An
unknown or unserved benchmark is INVALID_ARGUMENT naming the field (``reset.task``,
``evaluate.benchmark``, ``step.state.benchmark``). Its calls take and return plain Python
(the gRPC adapter, :mod:`aflowrl.envsvc.service`, translates protos):

* :meth:`Environment.reset` starts an episode (:func:`aflowrl.search.reset`: evaluates the seed
  workflow, selects the first parent) and returns the outcome with its state blob;
* :meth:`Environment.step` decodes the blob, runs :func:`aflowrl.search.step` and encodes the
  next blob; with ``fused`` selection the caller's values are the value source;
* :meth:`Environment.project` maps action text to the child's canonical action and hash,
  evaluating nothing;
* :meth:`Environment.evaluate` scores any workflow on a split or chosen problems, R times.

Everything an episode needs travels in its blob, so any replica serves any call, and a retried
call gives the same state, observation and reward (the retry's evaluation is answered by the
cache: its ``executor_calls`` are 0 and its ``cache_hits`` count the runs). Errors name the
request field (``step.state``, ``reset.task``...). Built and warmed up by
:mod:`aflowrl.envsvc.server`.

The executor is shared: its id is part of every cache key and of every episode state, and the
surrogate indexes the problems of every served benchmark (a workflow's answers and scores on a
benchmark are the same as on a replica serving that benchmark alone:
tests/integration/test_multi_benchmark_env.py).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from aflowrl import __version__, envs
from aflowrl.benchmarks.base import Benchmark, Problem
from aflowrl.config import BENCHMARKS
from aflowrl.config.environment import EnvironmentSpec, PoolName
from aflowrl.envsvc.blob import StateCodec, refused
from aflowrl.envsvc.errors import BadRequestError, SplitUnavailableError, StateBlobError
from aflowrl.envsvc.metrics import EnvironmentMetrics
from aflowrl.errors import InvalidInputError, NotFoundError
from aflowrl.executor.base import Executor
from aflowrl.search import (
    ActionMode,
    EpisodeState,
    EpisodeStateError,
    Projection,
    ResetOutcome,
    SearchContext,
    StaticValues,
    StepOutcome,
    graph_at,
    project_action,
    reset,
    step,
)
from aflowrl.workflow import (
    EvaluationCache,
    EvaluationResult,
    EvaluationSettings,
    Evaluator,
    Graph,
    select_problems,
)

logger = logging.getLogger(__name__)

SEARCH_SEED: Final = 0
"""Base seed of the search's evaluations (every replica the same, so their caches agree)."""
MAX_EVALUATORS: Final = 8
"""Evaluators kept for other seeds of ``Evaluate`` (least recently used first out; the search's
evaluator of each benchmark is always kept)."""
MAX_VALUE_ANCHORS: Final = 100_000
"""Most entries of one request's ``values``."""
MAX_EVALUATE_RUNS: Final = 200_000
"""Most problem runs (problems x repeats) of one ``Evaluate``."""
MAX_EPISODE_ID_CHARS: Final = 256
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class ServedBenchmark:
    """A benchmark a replica serves: its scorer and its loaded splits."""

    benchmark: Benchmark
    splits: Mapping[str, Sequence[Problem]]

    @property
    def name(self) -> str:
        return self.benchmark.name


@dataclass(frozen=True)
class StepResult:
    """A step's outcome, the next blob (empty when done) and the child workflow, if any."""

    outcome: StepOutcome
    blob: bytes
    child: Graph | None


@dataclass(frozen=True)
class ResetResult:
    outcome: ResetOutcome
    blob: bytes


@dataclass(frozen=True)
class ReplicaInfo:
    """What ``Info`` reports."""

    component: str
    version: str
    hostname: str
    tasks: tuple[str, ...]
    executor_id: str
    cache_entries: int
    cache_hits: int
    cache_misses: int


def state_values(
    values: Mapping[str, float] | None, default: float, *, field: str
) -> StaticValues | None:
    """Checked caller values (anchors are 64-hex hashes, values finite); None stays None."""
    if values is None:
        return None
    if len(values) > MAX_VALUE_ANCHORS:
        raise BadRequestError(
            f"{len(values)} anchors; at most {MAX_VALUE_ANCHORS} (send the episode's)", field=field
        )
    if not math.isfinite(default):
        raise BadRequestError(f"{default} is not finite", field=f"{field}.default_value")
    for anchor, value in values.items():
        if len(anchor) != 64 or not _HEX.issuperset(anchor):
            raise BadRequestError(
                f"{anchor[:80]!r} is not a workflow hash (64 lowercase hex digits)",
                field=f"{field}.values",
            )
        if not math.isfinite(value):
            raise BadRequestError(
                f"the value of {anchor[:12]} is {value}, not finite", field=f"{field}.values"
            )
    return StaticValues(values, default)


class Environment:
    """The environment of one replica (module docstring)."""

    def __init__(
        self,
        spec: EnvironmentSpec,
        *,
        benchmarks: Sequence[ServedBenchmark],
        executor: Executor,
        cache: EvaluationCache,
        metrics: EnvironmentMetrics,
        codec: StateCodec,
    ) -> None:
        if not benchmarks:
            raise ValueError("an environment serves at least one benchmark")
        for served in benchmarks:
            if spec.evaluation.split not in served.splits:
                raise SplitUnavailableError(
                    f"{served.name} has no {spec.evaluation.split} split loaded"
                )
        self.spec = spec
        self.benchmarks: dict[str, ServedBenchmark] = {
            served.name: ServedBenchmark(
                served.benchmark, {name: list(p) for name, p in served.splits.items()}
            )
            for served in benchmarks
        }
        self.executor = executor
        self.cache = cache
        self.metrics = metrics
        self.codec = codec
        self._evaluators: OrderedDict[tuple[str, int], Evaluator] = OrderedDict()
        self.contexts: dict[str, SearchContext] = {
            name: SearchContext(
                self.evaluator(name, SEARCH_SEED),
                served.splits[spec.evaluation.split],
                search=spec.search,
                evaluation=spec.evaluation,
                test_problems=served.splits.get("test", ()),
            )
            for name, served in self.benchmarks.items()
        }

    # ------------------------------------------------------------------ plumbing
    @property
    def served(self) -> tuple[str, ...]:
        """Names of the benchmarks this replica serves, in the spec's order."""
        return tuple(self.benchmarks)

    def evaluator(self, benchmark: str, seed: int) -> Evaluator:
        """The evaluator of ``benchmark`` and base seed ``seed`` (all of them share the
        executor, cache and metrics)."""
        key = (benchmark, seed)
        found = self._evaluators.get(key)
        if found is not None:
            self._evaluators.move_to_end(key)
            return found
        settings = dataclasses.replace(
            EvaluationSettings.from_spec(self.spec.evaluation), seed=seed
        )
        evaluator = Evaluator(
            self.executor,
            self.benchmarks[benchmark].benchmark,
            settings=settings,
            cache=self.cache,
            metrics=self.metrics,
        )
        self._evaluators[key] = evaluator
        others = [k for k in self._evaluators if k[1] != SEARCH_SEED]
        for oldest in others[: max(0, len(others) - MAX_EVALUATORS)]:
            del self._evaluators[oldest]
        return evaluator

    @property
    def fused(self) -> bool:
        return self.spec.search.selection == "fused"

    def _context(self, benchmark: str, values: StaticValues | None, field: str) -> SearchContext:
        context = self.contexts[benchmark]
        if not self.fused:
            return context
        if values is None:
            raise BadRequestError(
                "fused selection reads V(s) from the request (environment.search.valueSource="
                f"{self.spec.search.value_source}); send the values of the episode's workflows",
                field=field,
            )
        return dataclasses.replace(context, values=values)

    def check_task(self, task: str, field: str) -> ServedBenchmark:
        """The served benchmark ``task`` names; INVALID_ARGUMENT naming ``field`` otherwise."""
        found = self.benchmarks.get(task)
        if found is not None:
            return found
        served = ", ".join(self.served)
        if task not in BENCHMARKS:
            shown = repr(task[:64]) if task else "empty"
            raise BadRequestError(
                f"{shown} is no benchmark (known: {', '.join(BENCHMARKS)}); this replica "
                f"serves {served}",
                field=field,
            )
        raise BadRequestError(f"this replica serves {served}, not {task}", field=field)

    def _episode_benchmark(self, state: EpisodeState, field: str) -> str:
        """The benchmark the episode is on; a foreign state when this replica does not serve it."""
        if state.benchmark not in self.benchmarks:
            raise self._foreign(
                EpisodeStateError(
                    f"the episode is on {state.benchmark[:64]}; this replica serves "
                    f"{', '.join(self.served)}",
                    field="state.benchmark",
                ),
                field,
            )
        return state.benchmark

    def _check_task_type(self, graph: Graph, served: ServedBenchmark, field: str) -> None:
        if graph.task_type != served.benchmark.task_type:
            raise BadRequestError(
                f"the workflow is for {graph.task_type} tasks; {served.name} is a "
                f"{served.benchmark.task_type} benchmark",
                field=field,
            )

    def _decode(self, blob: bytes, field: str) -> EpisodeState:
        try:
            return self.codec.decode(blob, field=field)
        except StateBlobError:
            self.metrics.rejected_states.inc()
            raise

    def _foreign(self, exc: EpisodeStateError, field: str) -> StateBlobError:
        """A state that decoded but does not belong to this environment."""
        self.metrics.rejected_states.inc()
        return refused(exc, field)

    def _encode(self, state: EpisodeState) -> bytes:
        blob = self.codec.encode(state)
        self.metrics.state_size.observe(len(blob))
        return blob

    # ------------------------------------------------------------------ calls
    async def reset(
        self,
        *,
        task: str,
        seed: int,
        episode_id: str = "",
        seed_workflow: Graph | None = None,
        max_steps: int | None = None,
        action_mode: ActionMode | None = None,
        values: StaticValues | None = None,
        pool: PoolName = "all",
    ) -> ResetResult:
        """Start an episode on ``task`` (one of the benchmarks this replica serves), its problems
        drawn from problem pool ``pool`` (``evaluation.pools``)."""
        served = self.check_task(task, "reset.task")
        pools = self.spec.evaluation.pools
        share = {"held_out": pools.held_out, "tuning": pools.tuning}.get(pool)
        if share == 0:
            name = "heldOut" if pool == "held_out" else "tuning"
            raise BadRequestError(
                f"this environment has no {pool.replace('_', '-')} problem pool "
                f"(environment.evaluation.pools.{name} is 0)",
                field="reset.problem_pool",
            )
        if len(episode_id) > MAX_EPISODE_ID_CHARS:
            raise BadRequestError(
                f"{len(episode_id)} characters; at most {MAX_EPISODE_ID_CHARS}",
                field="reset.episode_id",
            )
        if max_steps is not None and not 1 <= max_steps <= 1000:
            raise BadRequestError(
                f"{max_steps} is not in 1..1000 (0: the server's default)", field="reset.max_steps"
            )
        if seed_workflow is not None:
            self._check_task_type(seed_workflow, served, "reset.seed_workflow_json")
        ctx = self._context(served.name, values, "reset.values")
        outcome = await reset(
            ctx,
            seed=seed,
            episode_id=episode_id,
            seed_workflow=seed_workflow,
            max_steps=max_steps,
            action_mode=action_mode,
            pool=pool,
        )
        self.metrics.resets.labels(served.name).inc()
        logger.info(
            "reset %s seed=%d %s: seed workflow %.4f",
            episode_id or "-",
            seed,
            served.name,
            outcome.state.nodes[0].score,
        )
        return ResetResult(outcome, self._encode(outcome.state))

    async def step(self, blob: bytes, action: str, values: StaticValues | None) -> StepResult:
        """Apply ``action`` to the episode in ``blob``: evaluate the child, select the next."""
        started = time.perf_counter()
        state = self._decode(blob, "step.state")
        ctx = self._context(self._episode_benchmark(state, "step.state"), values, "step.values")
        try:
            outcome = await step(ctx, state, action)
            child_index = outcome.info.child_index
            child = graph_at(outcome.state, child_index) if child_index is not None else None
        except EpisodeStateError as exc:
            raise self._foreign(exc, "step.state") from None
        next_blob = b"" if outcome.done else self._encode(outcome.state)
        self.metrics.steps.labels(str(outcome.info.valid_action).lower()).inc()
        self.metrics.step_duration.observe(time.perf_counter() - started)
        return StepResult(outcome, next_blob, child)

    def project(self, blob: bytes, action: str) -> Projection:
        """Where ``action`` lands on the episode's parent (nothing is evaluated)."""
        state = self._decode(blob, "project.state")
        ctx = self.contexts[self._episode_benchmark(state, "project.state")]
        try:
            return project_action(ctx, state, action)
        except EpisodeStateError as exc:
            raise self._foreign(exc, "project.state") from None

    async def evaluate(
        self,
        graph: Graph,
        *,
        benchmark: str,
        split: str,
        problem_ids: Sequence[str] = (),
        repeats: int | None = None,
        seed: int = SEARCH_SEED,
    ) -> EvaluationResult:
        """Score ``graph`` on ``benchmark``'s ``split`` (or the chosen problems of it),
        ``repeats`` times each."""
        served = self.check_task(benchmark, "evaluate.benchmark")
        self._check_task_type(graph, served, "evaluate.workflow_json")
        if split not in ("validate", "test"):
            raise BadRequestError(
                f"{split[:32]!r} is not a split (validate or test)", field="evaluate.split"
            )
        if split not in served.splits:
            raise SplitUnavailableError(
                f"evaluate.split: {served.name} has no {split} split in this replica's "
                f"data (loaded: {', '.join(sorted(served.splits))})"
            )
        count = repeats or self.spec.evaluation.repeats
        if not 1 <= count <= 1000:
            raise BadRequestError(
                f"{count} is not in 1..1000 (0: the server's default)", field="evaluate.repeats"
            )
        if len(set(problem_ids)) != len(problem_ids):
            twice = next(p for p in problem_ids if list(problem_ids).count(p) > 1)
            raise BadRequestError(f"{twice[:80]!r} is listed twice", field="evaluate.problem_ids")
        try:
            problems = select_problems(served.splits[split], list(problem_ids) or None)
        except (NotFoundError, InvalidInputError) as exc:
            raise BadRequestError(str(exc), field="evaluate.problem_ids") from None
        if len(problems) * count > MAX_EVALUATE_RUNS:
            raise BadRequestError(
                f"{len(problems)} problems x {count} repeats is over {MAX_EVALUATE_RUNS} runs",
                field="evaluate.repeats",
            )
        return await self.evaluator(served.name, seed).evaluate(graph, problems, repeats=count)

    def info(self) -> ReplicaInfo:
        hits, misses = self.metrics.cache_totals()
        return ReplicaInfo(
            component="environment",
            version=__version__,
            hostname=envs.AFLOWRL_POD_NAME,
            tasks=self.served,
            executor_id=self.executor.executor_id,
            cache_entries=len(self.cache),
            cache_hits=hits,
            cache_misses=misses,
        )
