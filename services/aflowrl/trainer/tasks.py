"""Which task each episode group plays: a benchmark drawn by weight, and a task seed.

A *task* is a benchmark and a task seed; the environment scores an episode's workflows on the
subset of that benchmark's validation problems the seed chooses
(``environment.evaluation.maxProblems``), starting from the seed workflow of the benchmark's
task type. Every iteration the trainer starts ``trainer.tasksPerIteration`` (B) tasks, each
played by one group of ``trainer.groupSize`` episodes.

**Benchmarks** come from ``environment.benchmarks`` only (never ``heldOutBenchmarks``), with
the weights w_b of ``environment.benchmarkWeights``. An iteration's B groups are a systematic
sample of those weights (Kitagawa, 1996): with u in [0, 1) derived from (``trainer.seed``,
iteration), group g plays the benchmark whose cumulative weight interval holds (u + g) / B.
So benchmark b gets floor(B w_b) or ceil(B w_b) of the iteration's groups (normalised w_b), in
expectation exactly B w_b, and an iteration with B >= the number of equally weighted
benchmarks covers every one of them. A run with one benchmark draws nothing.

**Task seeds**: group g of iteration i plays seed ``derive_seed(trainer.seed, "task", i, g)``,
which lies in [0, 2^31 - 1). Held-out task seeds (:func:`held_out_seed`) start at
:data:`HELD_OUT_SEED_BASE` = 2^31, so training never draws them: evaluation on held-out tasks
(:mod:`aflowrl.trainer.evaluate`) plays problem subsets chosen by seeds no training group had.

**Problem pools** (``environment.evaluation.pools``): training tasks draw their problems from
the training pool, held-out tasks from the held-out pool (:func:`held_out_pool`: every problem
when that pool's share is 0), so a held-out task shares no problem with any training task. With
``pools.heldOutSplit: test`` the held-out tasks a run ends with (:func:`run_held_out_tasks`)
take disjoint chunks of the test split instead (:func:`test_pool_tasks`), which no training or
tuning task ever sees.

Everything is a function of (spec, iteration), so a resumed run draws what an uninterrupted
one would. Used by :mod:`aflowrl.trainer.collect` and :mod:`aflowrl.trainer.evaluate`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from aflowrl.config import RunSpec
from aflowrl.config.environment import WITH_TEST_SPLIT, PoolName
from aflowrl.errors import InvalidInputError
from aflowrl.seeding import SEED_MODULUS, derive_seed

HELD_OUT_SEED_BASE: Final = 2**31
"""First held-out task seed; training task seeds are below it (``derive_seed`` < 2^31 - 1)."""
MAX_HELD_OUT_INDEX: Final = 2**31
"""Held-out seeds are ``HELD_OUT_SEED_BASE + k`` for k in [0, 2^31)."""


@dataclass(frozen=True)
class Task:
    """A benchmark and a task seed (the seed chooses the episode's validation problems from the
    task's problem pool)."""

    benchmark: str
    seed: int
    pool: PoolName = "all"
    """The problem pool the seed chooses from (``environment.evaluation.pools``)."""


def held_out_pool(spec: RunSpec) -> PoolName:
    """The pool of held-out tasks: "held_out", or "all" when the spec keeps no held-out pool."""
    return "held_out" if spec.environment.evaluation.pools.held_out > 0 else "all"


def tuning_pool(spec: RunSpec) -> PoolName:
    """The pool of tuning tasks: "tuning"; a spec without one cannot tune apart."""
    if spec.environment.evaluation.pools.tuning <= 0:
        raise InvalidInputError(
            "environment.evaluation.pools.tuning is 0: there is no tuning pool",
            field="environment.evaluation.pools.tuning",
        )
    return "tuning"


def systematic_sample(weights: Sequence[float], count: int, u: float) -> list[int]:
    """Indices of ``count`` systematic draws: k_g = min{k : C_k > (u + g) / count}, with C the
    cumulative normalised weights and u in [0, 1)."""
    if not weights or any(not (w > 0 and math.isfinite(w)) for w in weights):
        raise InvalidInputError(f"weights must be positive and finite, got {list(weights)}")
    if not 0.0 <= u < 1.0:
        raise InvalidInputError(f"u={u} is not in [0, 1)")
    cumulative = np.cumsum(np.asarray(weights, dtype=np.float64))
    cumulative /= cumulative[-1]
    points = (u + np.arange(count, dtype=np.float64)) / count
    picked = np.searchsorted(cumulative, points, side="right")
    return [min(int(k), len(weights) - 1) for k in picked]  # guards C_last rounding below 1


def draw_benchmarks(
    benchmarks: Sequence[str], weights: Sequence[float], count: int, *, seed: int, iteration: int
) -> list[str]:
    """The benchmark of each of an iteration's ``count`` groups (module docstring)."""
    if len(benchmarks) != len(weights):
        raise InvalidInputError(f"{len(benchmarks)} benchmarks but {len(weights)} weights")
    if len(benchmarks) == 1:
        return [benchmarks[0]] * count
    u = derive_seed(seed, "benchmarks", iteration) / SEED_MODULUS
    return [benchmarks[k] for k in systematic_sample(weights, count, u)]


def training_tasks(spec: RunSpec, iteration: int) -> list[Task]:
    """The ``trainer.tasksPerIteration`` tasks of ``iteration``, one per episode group."""
    trainer, env = spec.trainer, spec.environment
    names = draw_benchmarks(
        env.training_benchmarks,
        env.task_weights,
        trainer.tasks_per_iteration,
        seed=trainer.seed,
        iteration=iteration,
    )
    return [
        Task(name, derive_seed(trainer.seed, "task", iteration, group), "training")
        for group, name in enumerate(names)
    ]


def held_out_seed(index: int) -> int:
    """The ``index``-th held-out task seed (never a training task's: module docstring)."""
    if not 0 <= index < MAX_HELD_OUT_INDEX:
        raise InvalidInputError(f"{index} is not in [0, 2^31)", field="held-out task index")
    return HELD_OUT_SEED_BASE + index


def is_held_out_seed(seed: int) -> bool:
    """Whether ``seed`` is in the held-out range (no training group ever plays it)."""
    return seed >= HELD_OUT_SEED_BASE


def held_out_tasks(
    benchmarks: Sequence[str], count: int, *, seed: int, pool: PoolName = "held_out"
) -> list[Task]:
    """``count`` held-out tasks per benchmark in problem pool ``pool``, their indices derived
    from ``seed`` (the same ``seed`` gives the same tasks, whatever policy plays them: a paired
    comparison)."""
    return [
        Task(name, held_out_seed(derive_seed(seed, "held-out", name, k)), pool)
        for name in benchmarks
        for k in range(count)
    ]


def test_pool_tasks(benchmark: str, count: int, *, start: int) -> list[Task]:
    """``count`` tasks of ``benchmark``'s test pool with the consecutive held-out seeds
    ``start``, ``start + 1``, ...: disjoint chunks of its test split while ``count`` chunks fit
    (:func:`aflowrl.workflow.evaluator.disjoint_chunk`)."""
    return [Task(benchmark, held_out_seed(start + k), "test") for k in range(count)]


def run_held_out_tasks(spec: RunSpec, count: int) -> list[Task]:
    """The held-out tasks a run ends with: ``count`` per benchmark the run serves, from the
    split ``environment.evaluation.pools.heldOutSplit`` names (a benchmark without a test split
    keeps the held-out pool), derived from ``trainer.seed`` (the same tasks whatever policy
    plays them: a paired comparison)."""
    seed, pool = spec.trainer.seed, held_out_pool(spec)
    on_test = spec.environment.evaluation.pools.held_out_split == "test"
    tasks: list[Task] = []
    for name in spec.environment.served_benchmarks:
        if on_test and name in WITH_TEST_SPLIT:
            # Below 2^30, so the consecutive seeds stay in the held-out range.
            start = derive_seed(seed, "held-out-test", name) // 2
            tasks += test_pool_tasks(name, count, start=start)
        else:
            tasks += held_out_tasks([name], count, seed=seed, pool=pool)
    return tasks


def validation_tasks(spec: RunSpec, count: int) -> list[Task]:
    """The warm start's ``count`` validation episodes' tasks: benchmarks drawn by weight, task
    seeds from a namespace of their own in the held-out range, problems from the held-out
    pool (:func:`held_out_pool`)."""
    trainer, env = spec.trainer, spec.environment
    names = draw_benchmarks(
        env.training_benchmarks, env.task_weights, count, seed=trainer.seed, iteration=-2
    )
    return [
        Task(
            name,
            held_out_seed(derive_seed(trainer.seed, "warm-validation", k)),
            held_out_pool(spec),
        )
        for k, name in enumerate(names)
    ]


def warm_start_tasks(spec: RunSpec, count: int) -> list[Task]:
    """The tasks of the warm start's ``count`` behaviour episodes: benchmarks drawn by weight
    as an iteration's are, task seeds from their own namespace (below 2^31: not held out)."""
    trainer, env = spec.trainer, spec.environment
    names = draw_benchmarks(
        env.training_benchmarks, env.task_weights, count, seed=trainer.seed, iteration=-1
    )
    return [
        Task(name, derive_seed(trainer.seed, "warm-start", k), "training")
        for k, name in enumerate(names)
    ]
