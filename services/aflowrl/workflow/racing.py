"""Racing: when to stop scoring a workflow that cannot beat a target score.

The evaluator scores a raced workflow's problems in a uniformly random order, a batch at a time,
and after each batch asks whether its *full* mean score (over all ``N`` problems, the number a
complete evaluation would report) can still reach the target. It stops when, with probability at
least ``1 - delta``, it cannot. The probability is over the random order only: problems are a
fixed finite population and the first ``m`` scored are a sample drawn without replacement from
it, so the bound needs no assumption about how problems or scores are distributed.

Bound on the full mean ``mu`` after ``m`` of ``N`` problems, with per-problem scores ``x_i`` in
[0, 1] (means over the repeats), taking the smaller of two upper bounds:

* Serfling's inequality for sampling without replacement (Serfling 1974, Ann. Statist. 2,
  39-48; as restated by Bardenet & Maillard 2015, Bernoulli 21(3)):
  ``P(mu - mean_m >= eps) <= exp(-2 m eps^2 / (1 - (m - 1) / N))``, so with probability at
  least ``1 - d``: ``mu <= mean_m + sqrt((1 - (m - 1) / N) * ln(1 / d) / (2 m))``;
* the certain bound: every problem not yet scored scores 1, ``mu <= (sum_m + N - m) / N``.

The evaluator looks at the bound after every batch but the last: ``K = ceil(N / batch) - 1``
looks, each at ``d = delta / K`` (a union bound), so the chance that a stopped workflow would
have reached the target in full is at most ``delta`` however many looks there were.

Why not a paired bound on (child - parent) per problem, or an empirical-Bernstein one: the
target's full mean is known exactly, so the paired difference only adds the parent's known
scores, and it ranges over [-1, 1], doubling a range-based width; variance-adaptive (empirical
Bernstein-Serfling) bounds carry a ``~ 4.5 ln(5/d) / m`` term that exceeds the Serfling width
until ``m`` is in the thousands, far above the 50-300 validation problems a search scores. Both
were checked on the numbers before choosing this one.

Pure functions (no I/O); used by :meth:`aflowrl.workflow.evaluator.Evaluator.evaluate`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def looks(total: int, batch: int) -> int:
    """Times the bound is consulted when ``total`` problems are scored ``batch`` at a time."""
    if total < 1 or batch < 1:
        raise ValueError(f"total={total} and batch={batch} must be positive")
    return max(0, math.ceil(total / batch) - 1)


def serfling_width(scored: int, total: int, delta: float) -> float:
    """``sqrt((1 - (m - 1) / N) ln(1 / delta) / (2 m))``: Serfling's one-sided width, range 1."""
    if not 1 <= scored <= total:
        raise ValueError(f"scored={scored} must be in 1..total={total}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta={delta} must be in (0, 1)")
    rho = 1.0 - (scored - 1) / total
    return math.sqrt(rho * math.log(1.0 / delta) / (2.0 * scored))


def upper_bound(scores: Sequence[float], total: int, delta: float) -> float:
    """Upper confidence bound, at level ``1 - delta``, on the mean of all ``total`` scores.

    ``scores`` are the first ``m`` of a uniformly random order of the ``total`` per-problem
    scores (each in [0, 1]). The smaller of Serfling's bound and the certain bound; exact (the
    mean itself) when every problem is scored.
    """
    scored = len(scores)
    if scored == 0:
        return 1.0
    if any(not 0.0 <= s <= 1.0 for s in scores):
        raise ValueError("scores must lie in [0, 1]")
    if scored > total:
        raise ValueError(f"{scored} scores for a total of {total}")
    done = math.fsum(scores)
    certain = (done + (total - scored)) / total
    if scored == total:
        return certain
    return min(certain, done / scored + serfling_width(scored, total, delta))
