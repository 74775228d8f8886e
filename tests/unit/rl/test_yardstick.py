"""The learning benches' statistics against hand-computed oracles."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aflowrl.rl.yardstick import (
    distinct_outcomes,
    gains_below,
    learnable_share,
    oracle_leads,
    spearman,
    two_way_bootstrap,
)


def test_two_way_bootstrap_counts_the_seeds_as_units_too() -> None:
    # Every row the same: the tasks add no variance, the seeds do (a deterministic method
    # would get SE 0 from a bootstrap over tasks alone).
    matrix = np.tile(np.array([0.0, 1.0, 2.0, 3.0]), (30, 1))
    se = two_way_bootstrap(matrix, 4000, seed=1)
    expected = np.std([0.0, 1.0, 2.0, 3.0]) / math.sqrt(4)  # the seeds' bootstrap SE
    assert se == pytest.approx(expected, rel=0.1)
    # Every column the same: the tasks' variance alone.
    rows = np.arange(20, dtype=np.float64)[:, None] * np.ones((1, 3))
    assert two_way_bootstrap(rows, 4000, seed=2) == pytest.approx(
        np.std(np.arange(20.0)) / math.sqrt(20), rel=0.1
    )


def test_two_way_bootstrap_draws_a_cluster_of_rows_as_one_unit() -> None:
    # 4 clusters of 5 identical rows: the SE is that of 4 units, not 20.
    values = np.repeat(np.array([0.0, 1.0, 2.0, 3.0]), 5)[:, None] * np.ones((1, 2))
    labels = np.repeat(np.arange(4), 5).tolist()
    clustered = two_way_bootstrap(values, 4000, seed=3, clusters=labels)
    assert clustered == pytest.approx(np.std([0.0, 1.0, 2.0, 3.0]) / math.sqrt(4), rel=0.1)
    assert two_way_bootstrap(values, 4000, seed=3) < 0.6 * clustered
    with pytest.raises(ValueError):
        two_way_bootstrap(values, 10, clusters=[0, 1])


def test_two_way_bootstrap_of_a_constant_matrix_is_zero() -> None:
    assert two_way_bootstrap(np.full((5, 3), 0.25), 200) == 0.0


def test_oracle_leads_choose_on_the_first_reading_and_score_on_both() -> None:
    first = [0.1, 0.4, 0.2, 0.3]
    second = [0.3, 0.0, 0.2, 0.1]
    same, cross = oracle_leads(first, second)
    assert same == pytest.approx(0.4 - 0.25)
    assert cross == pytest.approx(0.0 - 0.15)  # action 1 is noise: below average elsewhere
    # Ties go to the earliest action.
    assert oracle_leads([0.2, 0.2], [1.0, 0.0]) == pytest.approx((0.0, 0.5))


def test_oracle_leads_refuses_readings_of_different_lengths() -> None:
    with pytest.raises(ValueError):
        oracle_leads([0.1, 0.2], [0.1])


def test_learnable_share_is_the_policys_part_of_the_room_above_random() -> None:
    assert learnable_share(0.03, 0.01, 0.05) == pytest.approx(0.5)
    assert learnable_share(0.0, 0.01, 0.05) == pytest.approx(-0.25)
    assert math.isnan(learnable_share(0.03, 0.05, 0.05))
    assert math.isnan(learnable_share(0.03, 0.05, 0.01))


def test_distinct_outcomes_count_actions_alike_on_every_problem_once() -> None:
    outcomes = [
        [(1.0, 0.0), (0.0, 0.0)],
        [(1.0, 0.0), (0.0, 0.0)],
        [(1.0, 1.0), (0.0, 0.0)],
        [(1.0, 0.0), (0.0, 0.0)],
    ]
    assert distinct_outcomes(outcomes) == 2
    assert distinct_outcomes([]) == 0


def test_spearman_matches_the_rank_formula_and_averages_ties() -> None:
    x = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert spearman(x, [2.0, 4.0, 6.0, 8.0, 100.0]) == pytest.approx(1.0)
    assert spearman(x, [5.0, 4.0, 3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    # No ties: 1 - 6 sum d^2 / (n (n^2 - 1)); ranks of y are 2 1 4 3 5: d^2 sum 4.
    assert spearman(x, [0.2, 0.1, 0.4, 0.3, 0.5]) == pytest.approx(1 - 6 * 4 / (5 * 24))
    # Ties: y ranks (1.5, 1.5, 3); Pearson of (1, 2, 3) and (1.5, 1.5, 3) = sqrt(3)/2.
    assert spearman([1.0, 2.0, 3.0], [0.0, 0.0, 1.0]) == pytest.approx(math.sqrt(3) / 2)
    assert math.isnan(spearman([1.0, 2.0], [3.0, 3.0]))
    assert math.isnan(spearman([1.0], [1.0]))


def test_gains_below_follow_the_tree_not_the_order_of_steps() -> None:
    # s0 -> a (0.5); s0 -> b (0.7); a -> c (0.9); b -> duplicate; a -> d (0.4)
    parents = ["s0", "s0", "a", "b", "a"]
    children = ["a", "b", "c", None, "d"]
    child_scores = [0.5, 0.7, 0.9, 0.7, 0.4]
    parent_scores = [0.6, 0.6, 0.5, 0.7, 0.5]
    gains = gains_below(parents, children, child_scores, parent_scores)
    # step 0: below s0 from step 0 on: a, b, c, d -> best 0.9 - 0.6
    # step 1: from step 1 on: b, c (under a, under s0), d -> 0.9 - 0.6
    # step 2: below a from step 2: c, d -> 0.9 - 0.5
    # step 3: below b from step 3: nothing new -> 0
    # step 4: below a from step 4: d (0.4 < 0.5) -> 0
    assert gains == pytest.approx([0.3, 0.3, 0.4, 0.0, 0.0])


def test_gains_below_refuse_ragged_input() -> None:
    with pytest.raises(ValueError):
        gains_below(["s"], ["a", "b"], [0.1], [0.0])
