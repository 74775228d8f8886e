"""The warm start's measures: its targets, its rows, its fit to labelled states, its budget."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aflowrl.trainer.rows import Decision
from aflowrl.trainer.warmstart import (
    LabelledState,
    fit_of,
    labelled_evaluations,
    supervised_rows,
    target_distribution,
)


def _state(rewards, *, duplicates=None, children=None, task=("gsm8k", 1, "training")):
    count = len(rewards)
    return LabelledState(
        benchmark=task[0],
        episode_id="e",
        step=0,
        observation="obs",
        actions=tuple(f"a{k}" for k in range(count)),
        rewards=tuple(rewards),
        duplicates=tuple(duplicates or [False] * count),
        decision=Decision(
            action="x",
            candidate_ids=tuple((k,) for k in range(count)),
            chosen=0,
            logprobs=(0.0,),
            value_ids=((1,), (2,)),
        ),
        task=task,
        children=tuple(children or [f"c{k}" for k in range(count)]),
    )


def test_targets_are_a_softmax_of_the_rewards_and_the_value_their_expectation():
    rewards = [0.1, 0.0, -0.05]
    q = target_distribution(rewards, 0.05)
    weights = np.exp(np.array(rewards) / 0.05)
    np.testing.assert_allclose(q, weights / weights.sum())
    [row] = supervised_rows([_state(rewards)], 0.05)
    assert row.target_weights == pytest.approx(q)
    assert row.value_target == pytest.approx(sum(w * r for w, r in zip(q, rewards, strict=True)))


def test_fit_measures_cross_entropy_top1_and_expected_reward():
    states = [_state([0.2, 0.0, 0.0]), _state([0.0, 0.1, 0.1])]
    uniform = [[math.log(1 / 3)] * 3] * 2
    fit = fit_of(states, uniform, 0.05)
    assert fit["expected_reward"] == pytest.approx((0.2 / 3 + 0.2 / 3) / 2)
    assert fit["best_reward"] == pytest.approx(0.15)
    assert fit["uniform_reward"] == pytest.approx(fit["expected_reward"])
    assert fit["cross_entropy"] == pytest.approx(math.log(3))
    # A policy sure of a best action: top-1 everywhere (ties count), the best reward.
    sharp = [np.log([0.98, 0.01, 0.01]).tolist(), np.log([0.01, 0.01, 0.98]).tolist()]
    fit = fit_of(states, sharp, 0.05)
    assert fit["top1"] == 1.0
    assert fit["expected_reward"] == pytest.approx((0.98 * 0.2 + (0.01 + 0.98) * 0.1) / 2)
    wrong = [np.log([0.01, 0.98, 0.01]).tolist(), sharp[1]]
    assert fit_of(states, wrong, 0.05)["top1"] == 0.5
    with pytest.raises(ValueError):
        fit_of(states, uniform[:1], 0.05)


def test_the_budget_counts_each_new_workflow_of_a_task_once():
    states = [
        _state([0.1, 0.0, -0.05], children=["x", "y", "z"], duplicates=[False, False, True]),
        _state([0.1, 0.0], children=["x", "w"]),  # x again on the same task: cached
        _state([0.1], children=["x"], task=("gsm8k", 2, "training")),  # another task
    ]
    assert labelled_evaluations(states) == 4  # x, y, w on task 1; x on task 2
