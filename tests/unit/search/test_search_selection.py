"""Parent selection: AFlow's probabilities (pinned to the paper's example), UCB, fused."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from aflowrl.errors import InvalidInputError
from aflowrl.search.selection import (
    NodeStats,
    aflow_candidates,
    aflow_probabilities,
    argmax,
    fused_scores,
    sample_aflow,
    ucb_scores,
)


def test_aflow_probabilities_match_the_example():
    probabilities = aflow_probabilities([80, 78, 75, 60], alpha=0.2, lambda_=0.3)
    assert [round(p, 3) for p in probabilities] == [0.415, 0.303, 0.200, 0.081]
    assert math.fsum(probabilities) == pytest.approx(1.0)


def test_aflow_probabilities_against_the_formula():
    rng = random.Random(1)
    for _ in range(50):
        scores = [rng.uniform(0, 100) for _ in range(rng.randrange(1, 8))]
        alpha, lam = rng.uniform(0, 1), rng.uniform(0, 1)
        top = max(scores)
        z = sum(math.exp(alpha * (s - top)) for s in scores)
        expected = [lam / len(scores) + (1 - lam) * math.exp(alpha * (s - top)) / z for s in scores]
        assert aflow_probabilities(scores, alpha=alpha, lambda_=lam) == pytest.approx(expected)
    assert aflow_probabilities([10, 90], alpha=0.2, lambda_=1.0) == [0.5, 0.5]


def test_aflow_candidates_are_the_seed_and_the_top_k_minus_one():
    nodes = [NodeStats(0.1, 1, is_root=True)] + [NodeStats(s, 1) for s in (0.5, 0.9, 0.7, 0.9, 0.2)]
    assert aflow_candidates(nodes, 4) == [0, 2, 3, 4]
    assert aflow_candidates(nodes, 1) == [0]
    assert aflow_candidates(nodes, 100) == list(range(6))


def test_aflow_sampling_follows_the_probabilities():
    nodes = [NodeStats(0.80, 1, is_root=True), NodeStats(0.78, 1), NodeStats(0.75, 1)]
    nodes += [NodeStats(0.60, 1), NodeStats(0.10, 1)]  # outside the top 4: never chosen
    rng = random.Random(7)
    counts = Counter(
        sample_aflow(nodes, rng, alpha=0.2, lambda_=0.3, top_k=4) for _ in range(20_000)
    )
    assert counts[4] == 0
    for index, expected in zip(range(4), [0.415, 0.303, 0.200, 0.081], strict=True):
        assert counts[index] / 20_000 == pytest.approx(expected, abs=0.015)
    first, second = random.Random(3), random.Random(3)
    draws = [sample_aflow(nodes, first, alpha=0.2, lambda_=0.3, top_k=4) for _ in range(20)]
    assert draws == [
        sample_aflow(nodes, second, alpha=0.2, lambda_=0.3, top_k=4) for _ in range(20)
    ]


def test_ucb_scores_follow_the_formula():
    nodes = [NodeStats(0.5, 3), NodeStats(0.6, 1), NodeStats(0.7, 4)]
    total = 8
    expected = [n.score + 1.5 * math.sqrt(math.log(total) / n.visits) for n in nodes]
    assert ucb_scores(nodes, 1.5) == pytest.approx(expected)
    assert argmax(ucb_scores(nodes, 1.5)) == 1  # the least visited wins here
    assert argmax(ucb_scores(nodes, 0.0)) == 2  # pure exploitation
    with pytest.raises(InvalidInputError):
        ucb_scores([NodeStats(0.5, 0)], 1.0)


def test_fused_scores_weigh_ucb_against_the_value():
    ucb = [1.2, 0.9, 1.0]
    values = [-0.5, 0.4, 0.0]
    assert fused_scores(ucb, values, 0.25) == pytest.approx(
        [0.75 * u + 0.25 * v for u, v in zip(ucb, values, strict=True)]
    )
    assert argmax(fused_scores(ucb, values, 0.0)) == 0
    assert argmax(fused_scores(ucb, values, 1.0)) == 1
    with pytest.raises(InvalidInputError, match="values"):
        fused_scores(ucb, values[:2], 0.5)


def test_argmax_breaks_ties_to_the_earliest():
    assert argmax([0.3, 0.7, 0.7, 0.1]) == 1
