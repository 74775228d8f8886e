"""Parent selection: which workflow of the tree the next edit modifies.

Three rules, each a pure function of the tree's statistics (and, for sampling, a seeded
``random.Random``):

* ``aflow`` (AFlow, Zhang et al., ICLR 2025, "AFlow: Automating Agentic Workflow Generation",
  section 3.3): the candidates are the seed workflow plus the top-(k-1) other workflows by mean
  score; with scores s_i in percent, n candidates and s_max their best,

      P(i) = lambda / n + (1 - lambda) * softmax_i(alpha * (s_i - s_max))

  (alpha 0.2, lambda 0.3, k 4 by default; scores 80, 78, 75, 60 give 0.415, 0.303, 0.200,
  0.081). The parent is sampled from P.
* ``ucb`` (UCB1, Auer et al., 2002): with mean score m_i in [0, 1], n_i the times node i was
  visited (1 for its own evaluation plus 1 per edit made from it) and N = sum_i n_i,

      UCB(i) = m_i + c * sqrt(ln N / n_i)

  and the parent is the argmax (ties to the earliest node).
* ``fused``: UCB fused with a learned value V(s_i) of the workflow state (a critic's estimate or
  the mean return observed from that state, :mod:`aflowrl.search.values`),

      F(i) = (1 - w) * UCB(i) + w * V(s_i)

  argmax again. Asking for ``fused`` without a value source is a configuration error.

Used by the episode state machine after every step.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from aflowrl.errors import InvalidInputError


@dataclass(frozen=True)
class NodeStats:
    """What selection knows of one tree node."""

    score: float
    """Mean validation score in [0, 1]."""
    visits: int
    """1 for its evaluation plus 1 per edit made from it."""
    is_root: bool = False


def aflow_candidates(nodes: Sequence[NodeStats], top_k: int) -> list[int]:
    """Indices of the root plus the top-(k-1) other nodes by score (ties: earlier first)."""
    if top_k < 1:
        raise InvalidInputError(f"{top_k} is not positive", field="top_k")
    roots = [i for i, n in enumerate(nodes) if n.is_root]
    others = sorted(
        (i for i, n in enumerate(nodes) if not n.is_root), key=lambda i: -nodes[i].score
    )
    return sorted(roots + others[: max(0, top_k - len(roots))])


def aflow_probabilities(scores: Sequence[float], *, alpha: float, lambda_: float) -> list[float]:
    """P(i) = lambda/n + (1-lambda) softmax(alpha (s_i - s_max)); scores in percent."""
    if not scores:
        raise InvalidInputError("no candidates to select from", field="scores")
    if not 0.0 <= lambda_ <= 1.0:
        raise InvalidInputError(f"{lambda_} is not in [0, 1]", field="lambda")
    n = len(scores)
    s_max = max(scores)
    weights = [math.exp(alpha * (s - s_max)) for s in scores]
    total = math.fsum(weights)
    softmax = [w / total for w in weights]
    return [lambda_ / n + (1.0 - lambda_) * p for p in softmax]


def ucb_scores(nodes: Sequence[NodeStats], c: float) -> list[float]:
    """UCB(i) = m_i + c sqrt(ln N / n_i), N = sum of visits."""
    if any(n.visits < 1 for n in nodes):
        raise InvalidInputError("every node has at least one visit", field="visits")
    total = sum(n.visits for n in nodes)
    log_total = math.log(total)
    return [n.score + c * math.sqrt(log_total / n.visits) for n in nodes]


def fused_scores(ucb: Sequence[float], values: Sequence[float], w: float) -> list[float]:
    """F(i) = (1 - w) UCB(i) + w V(s_i)."""
    if len(ucb) != len(values):
        raise InvalidInputError(f"{len(values)} values for {len(ucb)} nodes", field="values")
    return [(1.0 - w) * u + w * v for u, v in zip(ucb, values, strict=True)]


def argmax(scores: Sequence[float]) -> int:
    """Index of the largest score; ties go to the earliest."""
    best = 0
    for i, value in enumerate(scores):
        if value > scores[best]:
            best = i
    return best


def sample_aflow(
    nodes: Sequence[NodeStats], rng: random.Random, *, alpha: float, lambda_: float, top_k: int
) -> int:
    """AFlow's rule: sample a parent among the candidates with :func:`aflow_probabilities`."""
    candidates = aflow_candidates(nodes, top_k)
    probabilities = aflow_probabilities(
        [100.0 * nodes[i].score for i in candidates], alpha=alpha, lambda_=lambda_
    )
    return rng.choices(candidates, weights=probabilities, k=1)[0]
