"""Task drawing: deterministic, weights honoured, held-out benchmarks and task seeds never drawn."""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest

from aflowrl.config import RunSpec
from aflowrl.errors import InvalidInputError
from aflowrl.seeding import derive_seed
from aflowrl.trainer import tasks
from aflowrl.trainer.collect import group_episodes, seed_workflows


def _spec(**environment: object) -> RunSpec:
    return RunSpec.from_document(
        {
            "environment": {"data": {"dir": "/data"}, **environment},
            "trainer": {"tasksPerIteration": 3, "seed": 11},
        }
    )


def test_systematic_sampling_matches_its_definition_on_random_inputs():
    rng = np.random.default_rng(0)
    for _ in range(500):
        weights = list(rng.uniform(0.01, 5.0, size=int(rng.integers(1, 7))))
        count, u = int(rng.integers(1, 20)), float(rng.random())
        total = math.fsum(weights)
        expected = []
        for g in range(count):  # slow reference: walk the cumulative weights
            point, running = (u + g) / count, 0.0
            for k, w in enumerate(weights):
                running += w / total
                if point < running or k == len(weights) - 1:
                    expected.append(k)
                    break
        assert tasks.systematic_sample(weights, count, u) == expected


def test_each_benchmark_gets_floor_or_ceil_of_its_share_every_iteration():
    rng = np.random.default_rng(1)
    for _ in range(300):
        weights = list(rng.uniform(0.1, 4.0, size=int(rng.integers(2, 7))))
        count = int(rng.integers(1, 25))
        drawn = collections.Counter(tasks.systematic_sample(weights, count, float(rng.random())))
        for k, w in enumerate(weights):
            share = count * w / math.fsum(weights)
            assert math.floor(share) <= drawn[k] <= math.ceil(share), (weights, count, drawn)


def test_the_draw_is_deterministic_from_the_seed_and_iteration():
    spec = _spec(benchmarks=["gsm8k", "math", "humaneval"])
    first = [tasks.training_tasks(spec, i) for i in range(50)]
    again = [tasks.training_tasks(spec, i) for i in range(50)]
    assert first == again
    other = RunSpec.from_document({**spec.to_document(), "trainer": {"seed": 12}})
    assert [tasks.training_tasks(other, i) for i in range(50)] != first
    # The task seeds are those of a single-benchmark run: only the benchmark is drawn.
    assert [t.seed for t in first[7]] == [derive_seed(11, "task", 7, g) for g in range(3)]
    # With fewer groups than benchmarks, iterations draw different benchmarks (a fresh u each).
    two = RunSpec.from_document({**spec.to_document(), "trainer": {"tasksPerIteration": 2}})
    assert len({tuple(t.benchmark for t in tasks.training_tasks(two, i)) for i in range(50)}) == 3


def test_an_iteration_of_three_groups_covers_three_equally_weighted_benchmarks():
    spec = _spec(benchmarks=["gsm8k", "math", "humaneval"])
    for iteration in range(40):
        drawn = [t.benchmark for t in tasks.training_tasks(spec, iteration)]
        assert sorted(drawn) == ["gsm8k", "humaneval", "math"]


def test_weights_are_honoured_over_many_iterations():
    spec = RunSpec.from_document(
        {
            "environment": {
                "data": {"dir": "/data"},
                "benchmarks": ["gsm8k", "math", "humaneval"],
                "benchmarkWeights": {"gsm8k": 4, "math": 1},  # humaneval: 1
            },
            "trainer": {"tasksPerIteration": 2, "seed": 5},
        }
    )
    iterations = 3000
    counts = collections.Counter(
        t.benchmark for i in range(iterations) for t in tasks.training_tasks(spec, i)
    )
    draws = 2 * iterations
    for name, share in (("gsm8k", 4 / 6), ("math", 1 / 6), ("humaneval", 1 / 6)):
        # Within a few binomial standard errors (systematic draws vary less than independent
        # ones, so the bound is generous).
        se = math.sqrt(share * (1 - share) / draws)
        assert abs(counts[name] / draws - share) < 5 * se, (name, counts)
    # Every iteration, gsm8k (2 groups x 4/6 = 1.33) gets 1 or 2 of the 2 groups.
    for i in range(200):
        n = sum(t.benchmark == "gsm8k" for t in tasks.training_tasks(spec, i))
        assert n in (1, 2)


def test_held_out_benchmarks_are_never_drawn():
    spec = _spec(benchmarks=["mixed"], heldOutBenchmarks=["drop", "mbpp"])
    assert spec.environment.training_benchmarks == ("gsm8k", "math", "humaneval", "hotpotqa")
    drawn = {t.benchmark for i in range(500) for t in tasks.training_tasks(spec, i)}
    assert drawn == {"gsm8k", "math", "humaneval", "hotpotqa"}
    listed = _spec(benchmarks=["gsm8k", "math"], heldOutBenchmarks=["humaneval"])
    drawn = {t.benchmark for i in range(500) for t in tasks.training_tasks(listed, i)}
    assert drawn == {"gsm8k", "math"}


def test_held_out_task_seeds_are_never_training_seeds():
    spec = _spec(benchmarks=["gsm8k", "math", "humaneval"])
    training = {t.seed for i in range(2000) for t in tasks.training_tasks(spec, i)}
    assert max(training) < tasks.HELD_OUT_SEED_BASE
    assert not any(tasks.is_held_out_seed(seed) for seed in training)
    held = tasks.held_out_tasks(["gsm8k", "mbpp"], 50, seed=11)
    assert [t.benchmark for t in held] == ["gsm8k"] * 50 + ["mbpp"] * 50
    assert all(tasks.is_held_out_seed(t.seed) for t in held)
    assert len({t.seed for t in held}) == 100
    assert held == tasks.held_out_tasks(["gsm8k", "mbpp"], 50, seed=11)  # paired across methods
    assert tasks.held_out_seed(0) == 2**31 and tasks.held_out_seed(2**31 - 1) == 2**32 - 1
    with pytest.raises(InvalidInputError):
        tasks.held_out_seed(2**31)


def test_a_single_benchmark_run_draws_what_it_always_drew():
    spec = RunSpec.from_document({"trainer": {"tasksPerIteration": 2, "seed": 3}})
    for iteration in range(5):
        assert tasks.training_tasks(spec, iteration) == [
            tasks.Task("humaneval", derive_seed(3, "task", iteration, g), "training")
            for g in range(2)
        ]


def test_training_and_held_out_tasks_draw_from_their_own_problem_pools():
    spec = RunSpec.from_document({"trainer": {"tasksPerIteration": 2, "seed": 3}})
    assert {t.pool for i in range(5) for t in tasks.training_tasks(spec, i)} == {"training"}
    assert {t.pool for t in tasks.warm_start_tasks(spec, 6)} == {"training"}
    assert tasks.held_out_pool(spec) == "held_out"
    validation = tasks.validation_tasks(spec, 4)
    assert {t.pool for t in validation} == {"held_out"}
    assert all(tasks.is_held_out_seed(t.seed) for t in validation)
    no_pool = RunSpec.from_document({"environment": {"evaluation": {"pools": {"heldOut": 0}}}})
    assert tasks.held_out_pool(no_pool) == "all"
    with pytest.raises(InvalidInputError, match="tuning"):
        tasks.tuning_pool(spec)


def test_a_run_ends_on_disjoint_test_chunks_when_its_held_out_split_is_test():
    from aflowrl.benchmarks.base import Problem
    from aflowrl.workflow.evaluator import disjoint_chunk

    def spec(split: str) -> RunSpec:
        return RunSpec.from_document(
            {
                "environment": {
                    "data": {"dir": "/data"},
                    "benchmarks": ["humaneval", "hotpotqa"],
                    "evaluation": {"maxProblems": 12, "pools": {"heldOutSplit": split}},
                },
                "trainer": {"seed": 5},
            }
        )

    on_validation = tasks.run_held_out_tasks(spec("validate"), 8)
    assert on_validation == tasks.held_out_tasks(["humaneval", "hotpotqa"], 8, seed=5)
    on_test = tasks.run_held_out_tasks(spec("test"), 8)
    assert on_test == tasks.run_held_out_tasks(spec("test"), 8)  # paired across policies
    humaneval = [t for t in on_test if t.benchmark == "humaneval"]
    assert len(humaneval) == 8 and {t.pool for t in humaneval} == {"test"}
    assert all(tasks.is_held_out_seed(t.seed) for t in humaneval)
    problems = [Problem("humaneval", f"HumanEval/{i}", "q", "g") for i in range(131)]
    chunks = [
        {p.problem_id for p in disjoint_chunk(problems, 12, t.seed, benchmark="humaneval")}
        for t in humaneval
    ]
    assert len(set().union(*chunks)) == 8 * 12  # no problem in two tasks
    # HotpotQA has no test split: its tasks stay in the held-out validation pool.
    assert [t for t in on_test if t.benchmark == "hotpotqa"] == tasks.held_out_tasks(
        ["hotpotqa"], 8, seed=5
    )


def test_groups_start_from_the_seed_workflow_of_their_task_type():
    drawn = [tasks.Task("gsm8k", 1), tasks.Task("humaneval", 2)]
    episodes = group_episodes(drawn, 2, "it0")
    assert [(e.benchmark, e.seed, e.group, e.traj) for e in episodes] == [
        ("gsm8k", 1, 0, 0),
        ("gsm8k", 1, 0, 1),
        ("humaneval", 2, 1, 2),
        ("humaneval", 2, 1, 3),
    ]
    seeds = seed_workflows(["gsm8k", "math", "humaneval"])
    assert seeds["gsm8k"].task_type == "math" and seeds["humaneval"].task_type == "code"
    assert seeds["gsm8k"].content_hash == seeds["math"].content_hash  # one seed per task type


def test_bad_weights_are_refused():
    with pytest.raises(InvalidInputError):
        tasks.systematic_sample([1.0, 0.0], 2, 0.5)
    with pytest.raises(InvalidInputError):
        tasks.systematic_sample([1.0, math.inf], 2, 0.5)
    with pytest.raises(InvalidInputError):
        tasks.systematic_sample([1.0], 2, 1.0)
