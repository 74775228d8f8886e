"""Racing: the bound covers the full mean as stated, and a raced evaluation stops only then."""

from __future__ import annotations

import math
import random

import pytest

from aflowrl.benchmarks import get_benchmark
from aflowrl.benchmarks.base import Problem
from aflowrl.errors import InvalidInputError
from aflowrl.workflow import Evaluator, Graph, racing
from aflowrl.workflow.evaluator import Race


def _slow_width(m: int, n: int, delta: float) -> float:
    """Serfling's width by solving exp(-2 m eps^2 / (1 - (m-1)/n)) = delta for eps by bisection."""
    lo, hi = 0.0, 10.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if math.exp(-2 * m * mid * mid / (1 - (m - 1) / n)) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def test_serfling_width_solves_the_tail_bound():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 400)
        m = rng.randint(1, n)
        delta = rng.uniform(1e-4, 0.5)
        assert racing.serfling_width(m, n, delta) == pytest.approx(_slow_width(m, n, delta))


def test_the_bound_is_exact_when_all_are_scored_and_never_below_the_certain_bound():
    scores = [1.0, 0.0, 0.5, 1.0]
    assert racing.upper_bound(scores, 4, 0.05) == pytest.approx(0.625)
    # Two of four scored 0: at best the others score 1.
    assert racing.upper_bound([0.0, 0.0], 4, 0.05) == pytest.approx(0.5)
    assert racing.upper_bound([], 10, 0.05) == 1.0
    with pytest.raises(ValueError):
        racing.upper_bound([1.5], 3, 0.05)


def test_the_bound_covers_the_full_mean_with_the_stated_probability():
    """Monte Carlo over random orders of fixed populations, the hardest ones included."""
    rng = random.Random(1)
    delta = 0.1
    for population in (
        [1.0] * 45 + [0.0] * 5,
        [1.0] * 25 + [0.0] * 25,
        [rng.random() for _ in range(60)],
        [0.0] * 10 + [1.0] * 2,
    ):
        total = len(population)
        mu = math.fsum(population) / total
        misses = 0
        trials = 4000
        for _ in range(trials):
            order = population[:]
            rng.shuffle(order)
            m = rng.randint(1, total)
            if racing.upper_bound(order[:m], total, delta) < mu - 1e-12:
                misses += 1
        # Binomial(4000, <= 0.1): above 0.12 is > 4 standard deviations.
        assert misses / trials <= 0.12, (population[:5], misses)


def test_looks_count_the_batches_but_the_last():
    assert racing.looks(50, 10) == 4
    assert racing.looks(50, 16) == 3
    assert racing.looks(5, 10) == 0


MATH = [Problem("gsm8k", f"p{i}", f"What is {i} + 1?", str(i + 1)) for i in range(40)]
SEED = Graph.from_dict(
    {
        "name": "one",
        "task_type": "math",
        "nodes": [{"id": "generate", "op": "Custom", "inputs": {"input": ["problem"]}}],
        "output": "generate",
    }
)


def _answering(right_below: int):
    """Right on problems p0..p<right_below - 1>, wrong on the others."""

    def answer(prompt: str, seed: int | None) -> str:
        i = int(prompt.split("What is ", 1)[1].split(" ", 1)[0])
        return f"The answer is {i + 1 if i < right_below else i + 7}"

    return answer


async def test_a_hopeless_workflow_is_raced_out_early_and_says_so(scripted_executor):
    executor = scripted_executor(_answering(4))  # 10% right
    evaluator = Evaluator(executor, get_benchmark("gsm8k"))
    result = await evaluator.evaluate(SEED, MATH, race=Race(target=0.9, batch=8, seed=3))
    assert result.raced is not None
    stop = result.raced
    assert stop.scored == len(result.problems) < len(MATH) and stop.total == len(MATH)
    assert result.score_mean <= stop.bound < 0.9
    assert len(executor.calls) == stop.scored
    assert [p.problem.problem_id for p in result.problems] == sorted(
        (p.problem.problem_id for p in result.problems), key=lambda i: int(i[1:])
    )
    again = await Evaluator(scripted_executor(_answering(4)), get_benchmark("gsm8k")).evaluate(
        SEED, MATH, race=Race(target=0.9, batch=8, seed=3)
    )
    assert again.raced == stop  # the order is the seed's: a retry stops where this one did


async def test_a_contender_is_scored_in_full_and_matches_the_unraced_score(scripted_executor):
    raced = await Evaluator(scripted_executor(_answering(34)), get_benchmark("gsm8k")).evaluate(
        SEED, MATH, race=Race(target=0.8, batch=8, seed=3)
    )
    full = await Evaluator(scripted_executor(_answering(34)), get_benchmark("gsm8k")).evaluate(
        SEED, MATH
    )
    assert raced.raced is None and raced.score_mean == full.score_mean == 34 / 40


def test_race_settings_are_checked():
    with pytest.raises(InvalidInputError, match=r"race\.delta"):
        Race(target=0.5, delta=0.0)
    with pytest.raises(InvalidInputError, match=r"race\.target"):
        Race(target=1.5)
