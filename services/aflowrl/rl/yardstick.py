"""The statistics of ``bench/learning.py`` and ``bench/reward_noise.py``: pure functions.

* :func:`two_way_bootstrap`: the SE of the mean of a [tasks, seeds] matrix, units (tasks, or
  clusters of tasks that share problems) and seeds resampled independently (Davison &
  Hinkley's "pigeonhole" bootstrap), so that the variance between units of disjoint problems
  and between seeds both enter it;
* :func:`oracle_leads`: the one-step oracle's lead over a uniformly random action, the action
  chosen on one reading of the rewards and scored on the same reading (``same``) and on another,
  independent one (``cross``: cross-fitted, the part of the lead that is not noise);
* :func:`learnable_share`: (policy - random) / (ceiling - random);
* :func:`distinct_outcomes`: how many listed actions differ in outcome (actions whose children
  score alike on every problem and sample count once);
* :func:`spearman`: Spearman's rank correlation (ties get average ranks);
* :func:`gains_below`: for each step of a search, the gain the search realised below the
  workflow that step modified (the values' calibration pairs V(s) with it).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np


def two_way_bootstrap(
    matrix: np.ndarray,
    resamples: int,
    seed: int = 0,
    clusters: Sequence[Hashable] | None = None,
) -> float:
    """SE of the mean of a [rows, seeds] matrix, units and seeds resampled independently.

    The units are the rows, or, with ``clusters`` (one label per row), the groups of rows
    sharing a label: rows that are not independent (tasks sharing problems) are drawn together,
    a cluster weighing as many rows as it holds."""
    rows_n, seeds = matrix.shape
    labels = list(range(rows_n)) if clusters is None else list(clusters)
    if len(labels) != rows_n:
        raise ValueError(f"{len(labels)} cluster labels for {rows_n} rows")
    groups: dict[Hashable, list[int]] = {}
    for row, label in enumerate(labels):
        groups.setdefault(label, []).append(row)
    members = list(groups.values())
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for b in range(resamples):
        picked = rng.integers(len(members), size=len(members))
        rows = np.concatenate([members[k] for k in picked])
        cols = rng.integers(seeds, size=seeds)
        means[b] = matrix[np.ix_(rows, cols)].mean()
    return float(means.std(ddof=1))


def oracle_leads(first: Sequence[float], second: Sequence[float]) -> tuple[float, float]:
    """(same, cross): the action best on reading ``first`` (ties: the earliest), its lead over
    the mean action on ``first`` and on ``second`` (two readings of the same actions' rewards)."""
    if len(first) != len(second) or not first:
        raise ValueError(f"readings of {len(first)} and {len(second)} actions")
    best = int(np.argmax(first))
    return (
        float(first[best] - np.mean(first)),
        float(second[best] - np.mean(second)),
    )


def learnable_share(policy: float, random: float, ceiling: float) -> float:
    """(policy - random) / (ceiling - random); NaN when the ceiling is not above random."""
    if not ceiling > random:
        return math.nan
    return (policy - random) / (ceiling - random)


def distinct_outcomes(outcomes: Sequence[Sequence[Hashable]]) -> int:
    """The number of distinct outcome vectors (one per listed action: its child's score on each
    problem and sample)."""
    return len({tuple(v) for v in outcomes})


def _ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks, ties sharing the mean of the ranks they span."""
    x = np.asarray(values, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and x[order[j + 1]] == x[order[i]]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation; NaN with fewer than 2 pairs or a constant side."""
    if len(x) != len(y):
        raise ValueError(f"{len(x)} and {len(y)} values")
    if len(x) < 2:
        return math.nan
    rx, ry = _ranks(x), _ranks(y)
    if rx.std() == 0.0 or ry.std() == 0.0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def gains_below(
    parents: Sequence[Hashable],
    children: Sequence[Hashable | None],
    child_scores: Sequence[float],
    parent_scores: Sequence[float],
) -> list[float]:
    """For each step t of one search (step t edits workflow ``parents[t]``, scoring
    ``parent_scores[t]``, and adds ``children[t]`` scoring ``child_scores[t]``, or None when it
    added nothing: a duplicate or an invalid action), the gain realised below ``parents[t]``
    from step t on: max(0, best score of a workflow added at a step u >= t whose ancestry leads
    to ``parents[t]`` - ``parent_scores[t]``)."""
    n = len(parents)
    if not len(children) == len(child_scores) == len(parent_scores) == n:
        raise ValueError("one parent, child and two scores per step")
    up: dict[Hashable, Hashable] = {}
    for parent, child in zip(parents, children, strict=True):
        if child is not None and child not in up:
            up[child] = parent

    def below(node: Hashable, ancestor: Hashable) -> bool:
        seen = set()
        while node not in seen:
            if node == ancestor:
                return True
            seen.add(node)
            if node not in up:
                return False
            node = up[node]
        return False

    out = []
    for t in range(n):
        best = parent_scores[t]
        for u in range(t, n):
            child = children[u]
            if child is not None and below(child, parents[t]):
                best = max(best, child_scores[u])
        out.append(max(0.0, best - parent_scores[t]))
    return out
