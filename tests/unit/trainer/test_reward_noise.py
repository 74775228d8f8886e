"""Reward noise: a share of new children is scored again on other executor sample indices, and
the trainer reports the noise of the step rewards from those pairs of readings.

The executor is the calibrated surrogate on AFlow's MATH validation problems (stochastic across
sample indices); the oracle scores the same workflows with a cold evaluator of its own.
"""

from __future__ import annotations

import math
import statistics

import pytest

from aflowrl._proto.v1 import environment_pb2 as pb
from aflowrl.benchmarks import get_benchmark
from aflowrl.config import SearchSpec
from aflowrl.config.environment import EvaluationSpec
from aflowrl.search import SearchContext, apply_action, graph_at, parse_action, reset, step
from aflowrl.trainer import noise
from aflowrl.trainer.collect import batch_summary
from aflowrl.trainer.rows import Batch, Decision, Episode, StepRow
from aflowrl.workflow import EvaluationSettings, Evaluator

PROBLEMS = 8


@pytest.fixture(scope="module")
def math_problems(aflow_data):
    return get_benchmark("math").load("validate", aflow_data)


def _context(problems, executor, fraction: float) -> SearchContext:
    return SearchContext(
        Evaluator(executor, get_benchmark("math")),
        problems,
        search=SearchSpec(selection="aflow", max_steps=3, value_source="none"),
        evaluation=EvaluationSpec(max_problems=PROBLEMS, resample_fraction=fraction),
    )


async def _siblings(ctx: SearchContext, seed: int = 3):
    """Every listed action stepped from the start state: (action, outcome) pairs."""
    start = await reset(ctx, seed=seed)
    actions = start.observation.admissible_actions
    outcomes = [
        await step(ctx, start.state, f"<action>{k + 1}</action>") for k in range(len(actions))
    ]
    return start, list(zip(actions, outcomes, strict=True))


async def test_resampled_rewards_match_an_oracle_on_other_sample_indices(math_problems):
    from aflowrl.executor.surrogate import SurrogateExecutor

    ctx = _context(math_problems, SurrogateExecutor(math_problems), fraction=1.0)
    start, stepped = await _siblings(ctx)
    state = start.state
    problems = ctx.episode_problems(state.seed, state.problem_count, state.pool)
    parent = graph_at(state, state.parent)
    oracle = Evaluator(
        SurrogateExecutor(math_problems),
        get_benchmark("math"),
        settings=EvaluationSettings(repeats=2),
    )
    pairs = []
    for action, outcome in stepped:
        if outcome.info.duplicate:
            assert outcome.info.resampled_reward is None
            continue
        child = apply_action(parent, parse_action(action))
        before = await oracle.evaluate(parent, problems)
        after = await oracle.evaluate(child, problems)

        def later(result):
            return statistics.fmean(p.samples[1].score for p in result.problems)

        def first(result):
            return statistics.fmean(p.samples[0].score for p in result.problems)

        assert outcome.reward == pytest.approx(first(after) - first(before), abs=1e-12)
        assert outcome.info.resampled_reward == pytest.approx(
            later(after) - later(before), abs=1e-12
        )
        pairs.append((first(after) - first(before), later(after) - later(before)))
    assert len(pairs) >= 5
    stats = noise.reward_noise(
        [
            (o.reward, o.info.resampled_reward)
            for _, o in stepped
            if o.info.resampled_reward is not None
        ]
    )
    diffs = [a - b for a, b in pairs]
    assert stats["noise/resampled_steps"] == len(pairs)
    assert stats["noise/reward_noise_sd"] > 0.0  # the surrogate differs across sample indices
    assert stats["noise/reward_noise_sd"] == pytest.approx(
        math.sqrt(sum(d * d for d in diffs) / len(diffs) / 2)
    )
    assert stats["noise/reward_sd"] == pytest.approx(statistics.stdev(a for a, _ in pairs))


async def test_a_resample_fraction_of_zero_measures_nothing_and_costs_nothing(math_problems):
    from aflowrl.executor.surrogate import SurrogateExecutor

    off = _context(math_problems, SurrogateExecutor(math_problems), fraction=0.0)
    on = _context(math_problems, SurrogateExecutor(math_problems), fraction=1.0)
    _, quiet = await _siblings(off)
    _, measured = await _siblings(on)
    assert all(o.info.resampled_reward is None for _, o in quiet)
    assert [o.reward for _, o in quiet] == [o.reward for _, o in measured]
    assert sum(o.info.executor_calls for _, o in quiet) < sum(
        o.info.executor_calls for _, o in measured
    )


async def test_a_fraction_resamples_about_that_share_of_children_the_same_on_a_retry(math_problems):
    from aflowrl.executor.surrogate import SurrogateExecutor

    ctx = _context(math_problems, SurrogateExecutor(math_problems), fraction=0.5)
    resampled = evaluated = 0
    for seed in range(3):
        start, stepped = await _siblings(ctx, seed=seed)
        again = await step(ctx, start.state, "<action>1</action>")
        assert again.info.resampled_reward == stepped[0][1].info.resampled_reward
        fresh = [o for _, o in stepped if not o.info.duplicate]
        evaluated += len(fresh)
        resampled += sum(o.info.resampled_reward is not None for o in fresh)
    assert 0.2 * evaluated < resampled < 0.8 * evaluated


def test_the_noise_scalars_follow_their_formulas():
    readings = [(0.10, 0.05), (-0.05, 0.0), (0.20, 0.10), (0.0, 0.05)]
    stats = noise.reward_noise(readings)
    diff_sd = math.sqrt((0.05**2 + 0.05**2 + 0.10**2 + 0.05**2) / 4)
    sigma = diff_sd / math.sqrt(2)
    reward_sd = statistics.stdev([0.10, -0.05, 0.20, 0.0])
    assert stats == pytest.approx(
        {
            "noise/resampled_steps": 4.0,
            "noise/reward_diff_sd": diff_sd,
            "noise/reward_noise_sd": sigma,
            "noise/reward_sd": reward_sd,
            "noise/signal_to_noise": math.sqrt(reward_sd**2 - sigma**2) / sigma,
        }
    )
    assert noise.reward_noise([(0.1, 0.1)]) == {"noise/resampled_steps": 1.0}
    assert "noise/signal_to_noise" not in noise.reward_noise([(0.1, 0.1), (0.2, 0.2)])


def test_the_iteration_record_pools_the_pairs_of_steps_and_their_siblings():
    replies = [
        pb.StepResponse(reward=0.1, info=pb.StepInfo(resampled=True, resampled_reward=0.0)),
        pb.StepResponse(reward=0.3, info=pb.StepInfo(resampled=False, resampled_reward=0.0)),
        None,
        pb.StepResponse(reward=-0.1, info=pb.StepInfo(resampled=True, resampled_reward=0.1)),
    ]
    assert noise.pairs(replies) == ((0.1, 0.0), (-0.1, 0.1))
    decision = Decision(action="<action>1</action>", chosen=0, version=0)
    rows = [
        StepRow(0, 0, 0, "a", decision, reward=0.1, reward_pairs=noise.pairs(replies)),
        StepRow(1, 0, 0, "a", decision, reward=0.2, reward_pairs=((0.2, 0.25),)),
    ]
    episodes = [Episode(0, 0, 1, "e0", rows=[rows[0]]), Episode(1, 0, 1, "e1", rows=[rows[1]])]
    record = batch_summary(Batch(0, episodes))
    expected = noise.reward_noise([(0.1, 0.0), (-0.1, 0.1), (0.2, 0.25)])
    assert {k: v for k, v in record.items() if k.startswith("noise/")} == expected
    assert record["noise/resampled_steps"] == 3.0
