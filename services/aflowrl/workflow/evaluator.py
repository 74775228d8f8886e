"""The evaluator: score a workflow on a benchmark's problems, R times each, with a cache.

``await Evaluator(executor, benchmark, ...).evaluate(graph, problems, repeats=R)`` runs the
workflow on every (problem, sample index) pair with bounded concurrency, scores each answer with
the benchmark's scorer, and returns per-problem scores, the mean, the standard deviation over the
R repeats, cost, tokens and latency. Sample ``s`` of problem ``p`` always runs with the seed
``derive_seed(seed, benchmark, p, s)``, so a cached result and a fresh one agree; results are
cached by (workflow hash, problem, sample index, executor + settings) in memory and optionally in
SQLite (:mod:`aflowrl.workflow.cache`), and a repeated evaluation makes no executor call.

Statistics: ``score_mean`` is the mean over all problem runs (= the mean of the R per-repeat
means); ``score_std`` is the sample standard deviation (ddof=1) of the R per-repeat means, the
spread AFlow reports over its repeated runs (0 when R = 1).

Node reuse: below the whole-run cache, every run keeps its node draws (one per fan-out sample,
MedPrompt vote, or other node) keyed by the node's own content (operator, parameters,
instruction), its canonical position (which seeds its calls), the values its inputs carry, the
problem, the sample index and the executor key. A child workflow's run takes every draw its
parent already made (the nodes upstream of the edit, the samples a growing ensemble already has,
and nodes downstream of the edit whose inputs came out the same) and calls the executor only for
the rest. Results are those of a cold run, answer by answer; ``executor_calls``
counts the calls made, ``reused_calls`` those answered from earlier draws, and each sample's
``llm_calls`` and cost stay what one full run takes.

Racing (``race=``, off unless asked): problems are scored in a random order, a batch at a time,
and the evaluation stops once the workflow's full mean is below the target with probability at
least ``1 - delta`` (:mod:`aflowrl.workflow.racing`). The result then holds only the problems
scored and says so (:attr:`EvaluationResult.raced`): its mean is a partial one.

Failures: a run whose model output cannot be parsed scores 0 (and is cached: it is what this
workflow does on this problem with these seeds); a run over ``problem_timeout_s`` scores 0 and
is *not* cached (a timeout depends on load, not on the workflow); an executor or sandbox
infrastructure error stops the evaluation with that error, runs already finished stay cached,
so running again resumes where it stopped.

Used by ``aflowrl eval``, the environment service and the search.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from aflowrl.benchmarks.base import Benchmark, Problem, Score
from aflowrl.errors import InvalidInputError, NotFoundError
from aflowrl.executor.base import Executor
from aflowrl.seeding import derive_seed, stable_hash
from aflowrl.workflow import racing
from aflowrl.workflow.cache import CacheKey, DrawKey, EvaluationCache, ScoredRun, StoredDraw
from aflowrl.workflow.graph import Graph
from aflowrl.workflow.interpreter import Interpreter, RunResult
from aflowrl.workflow.runtime import Bill, CodeRunner, RunSettings

if TYPE_CHECKING:
    from aflowrl.config.environment import EvaluationSpec
    from aflowrl.envsvc.metrics import EnvironmentMetrics

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvaluationSettings:
    """How an evaluation runs (defaults match ``environment.evaluation`` of the RunSpec)."""

    repeats: int = 1
    """Runs of each problem (sample indices 0..R-1)."""
    concurrency: int = 16
    """Problem runs in flight at once."""
    problem_timeout_s: float = 300.0
    """Wall-clock limit of one run; over it the run scores 0."""
    seed: int = 0
    """Base seed of every run's seeds."""
    run: RunSettings = field(default_factory=RunSettings)
    """Executor and sandbox settings of the operators."""
    reuse_nodes: bool = True
    """Reuse node draws across workflows (answers are the same either way; off: every run of
    a workflow not cached as a whole pays for all its calls)."""

    @staticmethod
    def from_spec(spec: EvaluationSpec, run: RunSettings | None = None) -> EvaluationSettings:
        """From the run spec's ``environment.evaluation`` (``run``: the executor settings)."""
        return EvaluationSettings(
            repeats=spec.repeats,
            concurrency=spec.concurrency,
            problem_timeout_s=spec.problem_timeout_s,
            run=run or RunSettings(),
        )

    def __post_init__(self) -> None:
        if not 1 <= self.repeats <= 1000:
            raise InvalidInputError(f"{self.repeats} is not in 1..1000", field="repeats")
        if not 1 <= self.concurrency <= 100_000:
            raise InvalidInputError(f"{self.concurrency} is not positive", field="concurrency")
        if not self.problem_timeout_s > 0:
            raise InvalidInputError("must be positive", field="problem_timeout_s")


@dataclass(frozen=True, kw_only=True)
class SampleResult(ScoredRun):
    """One scored run of the workflow on one problem (what is cached, and where it came from)."""

    problem_id: str
    sample: int
    cached: bool
    """Whether it came from the cache (or from the same run in flight): no executor call."""
    fresh: Bill = field(default_factory=Bill, compare=False)
    """What this evaluation paid for it (nothing when cached; less than the run's own bill
    when node draws were reused)."""
    run: RunResult | None = field(default=None, repr=False, compare=False)
    """The fresh run with its trace (None when it came from the cache)."""

    def to_dict(self) -> dict[str, Any]:
        doc = {"sample": self.sample, **self.stored_fields(), "cached": self.cached}
        doc["fresh_llm_calls"] = self.fresh.llm_calls
        doc["latency_s"] = round(self.latency_s, 6)
        return doc


@dataclass(frozen=True)
class ProblemResult:
    """Every sample of one problem."""

    problem: Problem
    samples: tuple[SampleResult, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(s.score for s in self.samples)

    def to_dict(self) -> dict[str, Any]:
        return {
            "problem_id": self.problem.problem_id,
            "mean": self.mean,
            "samples": [s.to_dict() for s in self.samples],
        }


@dataclass(frozen=True)
class Race:
    """Stop an evaluation once the workflow cannot reach ``target`` (see :mod:`.racing`)."""

    target: float
    """The full mean score to beat (the parent's, or the best so far)."""
    delta: float = 0.05
    """Probability that a stopped workflow would have reached the target in full, at most."""
    batch: int = 10
    """Problems scored between two looks at the bound."""
    seed: int = 0
    """Seed of the order problems are scored in."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.target <= 1.0:
            raise InvalidInputError(f"{self.target} is not in [0, 1]", field="race.target")
        if not 0.0 < self.delta < 1.0:
            raise InvalidInputError(f"{self.delta} is not in (0, 1)", field="race.delta")
        if self.batch < 1:
            raise InvalidInputError(f"{self.batch} is not positive", field="race.batch")


@dataclass(frozen=True)
class RaceStop:
    """Why a raced evaluation stopped early: its full mean is below ``target`` w.h.p."""

    scored: int
    """Problems scored (the result holds these only)."""
    total: int
    """Problems a full evaluation scores."""
    bound: float
    """Upper confidence bound (level 1 - delta) on the full mean when it stopped."""
    target: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class EvaluationResult:
    """A workflow's evaluation on a set of problems."""

    workflow: str
    workflow_hash: str
    benchmark: str
    executor_id: str
    repeats: int
    problems: tuple[ProblemResult, ...]
    """The problems scored, in the order given (with racing, only those scored before it
    stopped)."""
    wall_s: float
    raced: RaceStop | None = None
    """Set when racing stopped the evaluation early: the means are then partial ones."""

    @property
    def samples(self) -> list[SampleResult]:
        return [s for p in self.problems for s in p.samples]

    @property
    def repeat_means(self) -> list[float]:
        """Mean score of each repeat over all problems."""
        return [
            statistics.fmean(p.samples[r].score for p in self.problems) for r in range(self.repeats)
        ]

    @property
    def score_mean(self) -> float:
        return statistics.fmean(s.score for s in self.samples)

    @property
    def score_std(self) -> float:
        means = self.repeat_means
        return statistics.stdev(means) if len(means) > 1 else 0.0

    @property
    def cost_usd(self) -> float | None:
        """Cost of the runs (cached runs count what they cost when made); None if unknown."""
        costs = [s.cost_usd for s in self.samples]
        return None if any(c is None for c in costs) else math.fsum(c or 0.0 for c in costs)

    @property
    def fresh_cost_usd(self) -> float | None:
        """Cost actually spent by this evaluation (cache hits and reused draws are free)."""
        costs = [s.fresh.cost_usd for s in self.samples]
        return None if any(c is None for c in costs) else math.fsum(c or 0.0 for c in costs)

    @property
    def executor_calls(self) -> int:
        """Executor calls this evaluation made (cache hits and reused draws make none)."""
        return sum(s.fresh.llm_calls for s in self.samples)

    @property
    def reused_calls(self) -> int:
        """Calls of the runs made now that were answered by node draws made earlier."""
        return sum(s.llm_calls - s.fresh.llm_calls for s in self.samples if not s.cached)

    @property
    def cache_hits(self) -> int:
        return sum(1 for s in self.samples if s.cached)

    @property
    def failures(self) -> int:
        """Runs that produced no answer (unparseable output, timeouts)."""
        return sum(1 for s in self.samples if s.error is not None)

    def wrong(self, limit: int | None = None) -> list[tuple[Problem, SampleResult]]:
        """Runs that scored below 1, worst first (for the search's failed examples)."""
        runs = [(p.problem, s) for p in self.problems for s in p.samples if s.score < 1.0]
        runs.sort(key=lambda item: item[1].score)
        return runs if limit is None else runs[:limit]

    def summary(self) -> dict[str, Any]:
        """Aggregates only (what the CLI table shows)."""
        samples = self.samples
        return {
            "workflow": self.workflow,
            "workflow_hash": self.workflow_hash,
            "benchmark": self.benchmark,
            "executor_id": self.executor_id,
            "problems": len(self.problems),
            "repeats": self.repeats,
            "score_mean": self.score_mean,
            "score_std": self.score_std,
            "repeat_means": self.repeat_means,
            "cost_usd": self.cost_usd,
            "fresh_cost_usd": self.fresh_cost_usd,
            "prompt_tokens": sum(s.prompt_tokens for s in samples),
            "completion_tokens": sum(s.completion_tokens for s in samples),
            "latency_mean_s": statistics.fmean(s.latency_s for s in samples),
            "wall_s": self.wall_s,
            "executor_calls": self.executor_calls,
            "reused_calls": self.reused_calls,
            "cache_hits": self.cache_hits,
            "failures": self.failures,
            "raced": None if self.raced is None else self.raced.to_dict(),
        }

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "per_problem": [p.to_dict() for p in self.problems]}


ProgressCallback = Callable[[SampleResult], None]


def select_problems(
    problems: Sequence[Problem], ids: Iterable[str] | None = None, limit: int | None = None
) -> list[Problem]:
    """``problems`` restricted to ``ids`` (in the order given) and/or the first ``limit``."""
    chosen = list(problems)
    if ids is not None:
        by_id = {p.problem_id: p for p in problems}
        wanted = list(ids)
        missing = [i for i in wanted if i not in by_id]
        if missing:
            raise NotFoundError(f"no problems {', '.join(missing[:5])} in this split")
        chosen = [by_id[i] for i in wanted]
    if limit is not None:
        chosen = chosen[:limit]
    if not chosen:
        raise InvalidInputError("no problems to evaluate", field="problems")
    return chosen


def subset(problems: Sequence[Problem], size: int | None, seed: int) -> list[Problem]:
    """A fixed random subset of ``size`` problems (all when None or larger), in split order.

    The same (problems, size, seed) always gives the same subset, so every workflow of an
    episode is scored on the same problems (``environment.evaluation.maxProblems``).
    """
    if size is None or size >= len(problems):
        return list(problems)
    chosen = set(random.Random(derive_seed("subset", seed)).sample(range(len(problems)), size))
    return [p for i, p in enumerate(problems) if i in chosen]


POOLS = ("all", "training", "tuning", "held_out")
"""Problem pools of a split (``environment.evaluation.pools``); "all" is the whole split. (An
episode of the ``test`` pool takes a :func:`disjoint_chunk` of the test split instead.)"""


def _ranked(problems: Sequence[Problem], salt: str, benchmark: str) -> list[Problem]:
    """``problems`` sorted by ``stable_hash(salt, benchmark, problem_id)`` (a stable sort)."""
    order = _ranking(salt, benchmark, tuple(p.problem_id for p in problems))
    return [problems[i] for i in order]


@functools.lru_cache(maxsize=256)
def _ranking(salt: str, benchmark: str, ids: tuple[str, ...]) -> tuple[int, ...]:
    """The positions of ``ids`` in the order of their stable hashes (ties: the earlier first).

    Memoised: every Step of an episode derives its problems again (:func:`disjoint_chunk`,
    :func:`pool_problems`), and hashing a 1,000-problem split each time cost a few percent of
    an environment replica's CPU; the ranking is a pure function of its arguments.
    """
    keys = [stable_hash(salt, benchmark, problem_id) for problem_id in ids]
    return tuple(sorted(range(len(ids)), key=keys.__getitem__))


def disjoint_chunk(
    problems: Sequence[Problem], size: int | None, seed: int, *, benchmark: str
) -> list[Problem]:
    """Chunk ``seed mod floor(n / size)`` of ``problems`` ranked by a stable hash, in split order.

    The chunks partition the ranked problems, so tasks whose seeds differ by less than
    floor(n / size) (consecutive seeds, say) share no problem: evaluation tasks that are
    independent units. ``size`` None or at least n: every problem.
    """
    if size is None or size >= len(problems):
        return list(problems)
    ranked = _ranked(problems, "chunk", benchmark)
    start = (seed % (len(ranked) // size)) * size
    ids = {p.problem_id for p in ranked[start : start + size]}
    return [p for p in problems if p.problem_id in ids]


def pool_size(share: float, total: int) -> int:
    """round(share x total), at least 1 when the share is above 0."""
    return max(1, round(share * total)) if share > 0 else 0


def pool_problems(
    problems: Sequence[Problem], pool: str, *, benchmark: str, held_out: float, tuning: float
) -> list[Problem]:
    """The problems of ``pool``, in split order (``environment.evaluation.pools``).

    Problems are ranked by a stable hash of (benchmark, problem id); the first
    :func:`pool_size` (held_out) are the held-out pool, the next (tuning) the tuning pool, the
    rest the training pool. So every replica and run agree, and the pools are disjoint.
    """
    if pool not in POOLS:
        raise InvalidInputError(f"{pool!r} is not one of {list(POOLS)}", field="problem_pool")
    if pool == "all":
        return list(problems)
    ranked = _ranked(problems, "pool", benchmark)
    held, tune = pool_size(held_out, len(ranked)), pool_size(tuning, len(ranked))
    if held + tune >= len(ranked):
        raise InvalidInputError(
            f"the held-out ({held}) and tuning ({tune}) pools leave none of {benchmark}'s "
            f"{len(ranked)} problems for training",
            field="evaluation.pools",
        )
    members = {
        "held_out": ranked[:held],
        "tuning": ranked[held : held + tune],
        "training": ranked[held + tune :],
    }[pool]
    if not members:
        share = "heldOut" if pool == "held_out" else "tuning"
        raise InvalidInputError(
            f"there is no {pool.replace('_', '-')} pool: environment.evaluation.pools.{share} is 0",
            field="problem_pool",
        )
    ids = {p.problem_id for p in members}
    return [p for p in problems if p.problem_id in ids]


class Evaluator:
    """Evaluates workflows on one benchmark with one executor."""

    def __init__(
        self,
        executor: Executor,
        benchmark: Benchmark,
        *,
        code_runner: CodeRunner | None = None,
        settings: EvaluationSettings | None = None,
        cache: EvaluationCache | None = None,
        metrics: EnvironmentMetrics | None = None,
    ) -> None:
        self.executor = executor
        self.benchmark = benchmark
        self.settings = settings or EvaluationSettings()
        self.cache = cache if cache is not None else EvaluationCache()
        self.metrics = metrics
        self.interpreter = Interpreter(executor, code_runner, self.settings.run)
        self._hits = 0
        self._lookups = 0
        self._inflight: dict[CacheKey, asyncio.Future[SampleResult]] = {}
        self._inflight_draws: dict[DrawKey, asyncio.Future[StoredDraw]] = {}
        self.executor_key = (
            f"{executor.executor_id}|{self.settings.run.fingerprint()}|seed={self.settings.seed}"
        )
        """Executor id, run settings and base seed: what besides the workflow and the problem
        decides answers (the cache keys on it; episode states record it)."""

    def sample_seed(self, problem: Problem, sample: int) -> int:
        """The seed of sample ``sample`` of ``problem`` (the same in every evaluation)."""
        return derive_seed(self.settings.seed, problem.benchmark, problem.problem_id, sample)

    def cache_key(self, graph: Graph, problem: Problem, sample: int) -> CacheKey:
        return CacheKey(
            workflow_hash=graph.content_hash,
            problem=f"{problem.benchmark}/{problem.problem_id}",
            sample=sample,
            executor=self.executor_key,
        )

    async def evaluate(
        self,
        graph: Graph,
        problems: Sequence[Problem],
        *,
        repeats: int | None = None,
        progress: ProgressCallback | None = None,
        race: Race | None = None,
    ) -> EvaluationResult:
        """Run and score ``graph`` on every problem ``repeats`` times (default: settings).

        With ``race``, stop early once ``graph`` cannot reach ``race.target`` (module docs).
        """
        if graph.task_type != self.benchmark.task_type:
            raise InvalidInputError(
                f"workflow {graph.name!r} is for {graph.task_type} tasks; {self.benchmark.name} "
                f"is a {self.benchmark.task_type} benchmark",
                field="workflow.task_type",
            )
        if not problems:
            raise InvalidInputError("no problems to evaluate", field="problems")
        count = repeats if repeats is not None else self.settings.repeats
        if not 1 <= count <= 1000:
            raise InvalidInputError(f"{count} is not in 1..1000", field="repeats")
        started = time.perf_counter()
        limiter = asyncio.Semaphore(self.settings.concurrency)

        async def one(problem: Problem, sample: int) -> SampleResult:
            result = await self._sample(graph, problem, sample, limiter)
            if progress is not None:
                progress(result)
            return result

        async def batch(chosen: Sequence[Problem]) -> list[ProblemResult]:
            # Repeat-major order: with a progress bar, the first repeat over all problems
            # finishes first, as AFlow's repeated runs do.
            flat = await _gather_all(
                [one(problem, sample) for sample in range(count) for problem in chosen]
            )
            return [
                ProblemResult(problem, tuple(flat[s * len(chosen) + i] for s in range(count)))
                for i, problem in enumerate(chosen)
            ]

        stop: RaceStop | None = None
        if race is None:
            scored = await batch(problems)
        else:
            scored, stop = await _race(batch, problems, race)
        result = EvaluationResult(
            workflow=graph.name,
            workflow_hash=graph.content_hash,
            benchmark=self.benchmark.name,
            executor_id=self.executor.executor_id,
            repeats=count,
            problems=tuple(scored),
            wall_s=time.perf_counter() - started,
            raced=stop,
        )
        if self.metrics is not None:
            self.metrics.evaluations.labels(self.benchmark.name).inc()
            self.metrics.evaluation_duration.labels(self.benchmark.name).observe(result.wall_s)
        logger.info(
            "%s on %s: %.4f +- %.4f over %d problems x %d (%d executor calls, %d reused, "
            "%d cached)%s",
            graph.name,
            self.benchmark.name,
            result.score_mean,
            result.score_std,
            len(result.problems),
            count,
            result.executor_calls,
            result.reused_calls,
            result.cache_hits,
            ""
            if stop is None
            else f"; raced out after {stop.scored}/{stop.total} problems (bound "
            f"{stop.bound:.4f} < target {stop.target:.4f})",
        )
        return result

    async def _sample(
        self, graph: Graph, problem: Problem, sample: int, limiter: asyncio.Semaphore
    ) -> SampleResult:
        """A cached result, the result of the same run already in flight, or a fresh run."""
        key = self.cache_key(graph, problem, sample)
        cached = self.cache.get(key)
        shared = self._inflight.get(key) if cached is None else None
        self._record_lookup(cached is not None or shared is not None)
        if cached is not None:
            return _sample_result(problem, sample, cached, cached=True)
        if shared is not None:
            # Another evaluation (e.g. a trajectory that reached the same workflow) is running
            # exactly this; share its result rather than paying twice.
            try:
                result = await asyncio.shield(shared)
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
                return await self._sample(graph, problem, sample, limiter)  # its owner gave up
            return dataclasses.replace(result, cached=True, fresh=Bill(), run=None)
        task = asyncio.ensure_future(self._fresh(graph, problem, sample, key, limiter))
        self._inflight[key] = task
        task.add_done_callback(lambda _: self._inflight.pop(key, None))
        return await task

    async def _fresh(
        self,
        graph: Graph,
        problem: Problem,
        sample: int,
        key: CacheKey,
        limiter: asyncio.Semaphore,
    ) -> SampleResult:
        async with limiter:
            try:
                draws = (
                    _Draws(self, f"{problem.benchmark}/{problem.problem_id}", sample)
                    if self.settings.reuse_nodes
                    else None
                )
                run = await asyncio.wait_for(
                    self.interpreter.run(
                        graph,
                        problem,
                        seed=self.sample_seed(problem, sample),
                        draws=draws,
                    ),
                    timeout=self.settings.problem_timeout_s,
                )
            except TimeoutError:
                return self._timed_out(problem, sample)
            if run.error is not None:
                score = Score(0.0, "", run.error)
            else:
                score = await self.benchmark.score(problem, run.answer)
        stored = ScoredRun(
            score=score.value,
            answer=run.answer,
            extracted=score.extracted,
            detail=score.detail,
            error=run.error,
            cost_usd=run.cost_usd,
            prompt_tokens=run.usage.prompt_tokens,
            completion_tokens=run.usage.completion_tokens,
            latency_s=run.latency_s,
            llm_calls=run.llm_calls,
            sandbox_runs=run.sandbox_runs,
        )
        self.cache.put(key, stored)
        self._record_run(run)
        return _sample_result(problem, sample, stored, cached=False, run=run, fresh=run.fresh)

    def _timed_out(self, problem: Problem, sample: int) -> SampleResult:
        limit = self.settings.problem_timeout_s
        logger.warning(
            "%s/%s sample %d: over %.0f s, scored 0",
            problem.benchmark,
            problem.problem_id,
            sample,
            limit,
        )
        if self.metrics is not None:
            self.metrics.problem_runs.labels(self.benchmark.name).inc()
        return SampleResult(
            problem_id=problem.problem_id,
            sample=sample,
            cached=False,
            score=0.0,
            answer="",
            extracted="",
            detail="timeout",
            error=f"timeout after {limit:g} s",
            cost_usd=None,
            prompt_tokens=0,
            completion_tokens=0,
            latency_s=limit,
            llm_calls=0,
            sandbox_runs=0,
        )

    def _record_lookup(self, hit: bool) -> None:
        self._lookups += 1
        self._hits += int(hit)
        if self.metrics is None:
            return
        (self.metrics.cache_hits if hit else self.metrics.cache_misses).inc()
        self.metrics.cache_hit_ratio.set(self._hits / self._lookups)

    def _record_run(self, run: RunResult) -> None:
        metrics = self.metrics
        if metrics is None:
            return
        metrics.problem_runs.labels(self.benchmark.name).inc()
        for event in run.trace:
            if event.kind == "llm":
                metrics.executor_requests.labels("ok").inc()
                metrics.executor_latency.observe(event.latency_s)
                metrics.executor_tokens.labels("prompt").inc(event.prompt_tokens)
                metrics.executor_tokens.labels("completion").inc(event.completion_tokens)
                if event.cost_usd is None:
                    metrics.executor_unpriced_requests.inc()
                else:
                    metrics.executor_cost.inc(event.cost_usd)
            elif event.kind == "sandbox" and event.status is not None:
                metrics.sandbox_runs.labels(event.status).inc()


def _sample_result(
    problem: Problem,
    sample: int,
    stored: ScoredRun,
    *,
    cached: bool,
    run: RunResult | None = None,
    fresh: Bill | None = None,
) -> SampleResult:
    return SampleResult(
        problem_id=problem.problem_id,
        sample=sample,
        cached=cached,
        fresh=fresh or Bill(),
        run=run,
        **stored.stored_fields(),
    )


_T = TypeVar("_T")


async def _gather_all(coros: Sequence[Awaitable[_T]]) -> list[_T]:
    """Run concurrently; on any error cancel the rest and collect them before raising."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _race(
    batch: Callable[[Sequence[Problem]], Awaitable[list[ProblemResult]]],
    problems: Sequence[Problem],
    race: Race,
) -> tuple[list[ProblemResult], RaceStop | None]:
    """Score ``problems`` in a random order, ``race.batch`` at a time, until done or raced out.

    Returns the results in the order ``problems`` were given, and the stop (None: all scored).
    """
    total = len(problems)
    order = list(range(total))
    random.Random(derive_seed("race", race.seed)).shuffle(order)
    level = race.delta / max(1, racing.looks(total, race.batch))
    done: dict[int, ProblemResult] = {}
    stop: RaceStop | None = None
    for start in range(0, total, race.batch):
        chosen = order[start : start + race.batch]
        for index, result in zip(chosen, await batch([problems[i] for i in chosen]), strict=True):
            done[index] = result
        if len(done) == total:
            break
        # Means of scores in [0, 1]; clipped so float noise in a scorer cannot stop a race.
        means = [min(1.0, max(0.0, done[i].mean)) for i in order[: len(done)]]
        bound = racing.upper_bound(means, total, level)
        if bound < race.target:
            stop = RaceStop(len(done), total, bound, race.target)
            break
    return [done[i] for i in sorted(done)], stop


class _Draws:
    """The evaluator's node cache as seen by one run: draws of one problem and sample.

    A draw already stored is reused; one being made by a concurrent run (another workflow of
    the group reaching the same node) is awaited rather than made twice.
    """

    def __init__(self, evaluator: Evaluator, problem: str, sample: int) -> None:
        self._evaluator = evaluator
        self._problem = problem
        self._sample = sample

    async def draw(
        self, draw: str, make: Callable[[], Awaitable[StoredDraw]]
    ) -> tuple[StoredDraw, bool]:
        evaluator = self._evaluator
        key = DrawKey(draw, self._problem, self._sample, evaluator.executor_key)
        stored = evaluator.cache.get_draw(key)
        if stored is not None:
            return stored, True
        shared = evaluator._inflight_draws.get(key)
        if shared is not None:
            try:
                return await asyncio.shield(shared), True
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
                return await self.draw(draw, make)  # its maker gave up (timed out)
        task = asyncio.ensure_future(make())
        evaluator._inflight_draws[key] = task
        task.add_done_callback(lambda _: evaluator._inflight_draws.pop(key, None))
        made = await task
        evaluator.cache.put_draw(key, made)
        return made, False
