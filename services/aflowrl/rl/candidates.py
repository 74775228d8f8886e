"""Scoring candidate continuations, numpy side: the choice distribution and the value bins.

A choice-mode policy scores every admissible action k by the log-likelihood of its reply's
tokens w_{k,1..n_k} after the prompt s (Carta et al., 2023, arXiv 2302.02662), *length
normalised* so a long action is not penalised for its length:

    score_k  = (1 / n_k) sum_t log p(w_{k,t} | s, w_{k,<t})          (``length_normalised``)
    score_k  =           sum_t log p(w_{k,t} | s, w_{k,<t})          (otherwise)
    log pi_k = score_k - logsumexp_j score_j

The policy's value of the state s is read from the same model (no extra head): the replies
``<value>0`` ... ``<value>{B-1}`` are scored after the same prompt, *summed* (their shared
``<value>`` prefix then cancels in the softmax, leaving p(bin b | s, "<value>")), and

    p_b  = softmax_b(ll_b),   c_b = v_min + b (v_max - v_min) / (B - 1),   V(s) = sum_b p_b c_b

It is trained by cross-entropy against the two-hot projection of the target return onto the
bin centres (Bellemare et al., 2017, arXiv 1707.06887; Farebrother et al., 2024, arXiv
2403.03950): a target between c_b and c_{b+1} puts weight (c_{b+1} - G) / Delta on b and the
rest on b + 1; targets outside [v_min, v_max] are clipped to the end bins.

The torch side (the learner's differentiable versions of the same formulas) is
:mod:`aflowrl.rl.choice`; the two agree (oracle tests). This module needs only numpy, so the
torch-free trainer and the environment-side tools import it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from aflowrl.rl.errors import RLInputError

__all__ = [
    "bin_centres",
    "candidate_scores",
    "choice_log_probs",
    "expected_value",
    "two_hot",
]


def candidate_scores(
    candidate_logprobs: Sequence[Sequence[float]], *, length_normalised: bool
) -> NDArray[np.float64]:
    """score_k of every candidate from its token log-probs (module docstring), [K] float64."""
    if not candidate_logprobs:
        raise RLInputError("no candidates", field="candidates")
    scores = np.empty(len(candidate_logprobs), dtype=np.float64)
    for k, values in enumerate(candidate_logprobs):
        if len(values) == 0:
            raise RLInputError(f"candidate {k} has no tokens", field="candidates")
        total = math.fsum(float(v) for v in values)
        scores[k] = total / len(values) if length_normalised else total
    if not np.all(np.isfinite(scores)):
        raise RLInputError("a candidate's log-likelihood is not finite", field="candidates")
    return scores


def choice_log_probs(
    candidate_logprobs: Sequence[Sequence[float]], *, length_normalised: bool
) -> NDArray[np.float64]:
    """log pi_k = score_k - logsumexp_j score_j over the candidates, [K] float64."""
    scores = candidate_scores(candidate_logprobs, length_normalised=length_normalised)
    top = float(scores.max())
    return scores - (top + math.log(float(np.exp(scores - top).sum())))


def bin_centres(v_min: float, v_max: float, bins: int) -> NDArray[np.float64]:
    """c_b = v_min + b (v_max - v_min) / (B - 1), b = 0..B-1."""
    if bins < 2:
        raise RLInputError(f"{bins} bins; at least 2 are needed", field="bins")
    if not (math.isfinite(v_min) and math.isfinite(v_max) and v_min < v_max):
        raise RLInputError(f"[{v_min}, {v_max}] is not an interval", field="v_min")
    return np.linspace(v_min, v_max, bins, dtype=np.float64)


def expected_value(
    bin_log_probs: Sequence[float], centres: Sequence[float] | NDArray[np.float64]
) -> float:
    """V = sum_b p_b c_b, with p the softmax of the bins' (summed) log-likelihoods."""
    ll = np.asarray(bin_log_probs, dtype=np.float64)
    c = np.asarray(centres, dtype=np.float64)
    if ll.shape != c.shape or ll.ndim != 1:
        raise RLInputError(
            f"{ll.shape[0] if ll.ndim else 0} bin scores for {c.shape[0]} centres", field="bins"
        )
    if not np.all(np.isfinite(ll)):
        raise RLInputError("a value bin's log-likelihood is not finite", field="bins")
    p = np.exp(ll - ll.max())
    p /= p.sum()
    return float(np.dot(p, c))


def two_hot(target: float, centres: Sequence[float] | NDArray[np.float64]) -> NDArray[np.float64]:
    """The two-hot distribution over the bins whose mean is ``target`` (clipped to the range)."""
    c = np.asarray(centres, dtype=np.float64)
    if not math.isfinite(target):
        raise RLInputError(f"{target} is not finite", field="target")
    g = min(max(float(target), float(c[0])), float(c[-1]))
    weights = np.zeros_like(c)
    upper = int(np.searchsorted(c, g, side="left"))
    if upper == 0:
        weights[0] = 1.0
        return weights
    lower = upper - 1
    width = float(c[upper] - c[lower])
    weights[lower] = (float(c[upper]) - g) / width
    weights[upper] = 1.0 - weights[lower]
    return weights
