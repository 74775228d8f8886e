"""Executor-sample noise of the step rewards the learner saw (``noise/*`` in metrics.jsonl).

A step reward is a difference of two validation scores, each a mean over the episode's problems
of an executor's sampled answers. For ``environment.evaluation.resampleFraction`` of the new
children the environment measures the reward a second time on other executor sample indices
(:mod:`aflowrl.search.episode`), so each such step gives a pair (r, r') of two readings of the
same reward of the same workflows. Their difference d = r - r' is pure sampling noise; the
spread among sibling edits at one state is not (siblings are different workflows). From the
iteration's n pairs (the sampled steps and their sibling step groups' Steps):

* ``noise/resampled_steps``: n;
* ``noise/reward_diff_sd``: sqrt(mean(d^2)), the sd of the difference of two readings (E[d] = 0:
  both are draws of the same distribution);
* ``noise/reward_noise_sd``: sigma = reward_diff_sd / sqrt(2), the noise sd of one reward;
* ``noise/reward_sd``: the sd (ddof=1) of the first readings r (what the learner saw);
* ``noise/signal_to_noise``: sqrt(max(var(r) - sigma^2, 0)) / sigma, the sd of the rewards'
  true part over the sd of their noise (about 1 or less: a reward is as much noise as signal).

With fewer than two pairs only ``noise/resampled_steps`` is written; with sigma = 0 (a
deterministic executor) the signal-to-noise ratio is left out. With ``search.reward =
improvement`` the readings are clipped at 0 and sigma understates the noise of the difference
underneath. Called by :func:`aflowrl.trainer.collect.batch_summary`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

from aflowrl._proto.v1 import environment_pb2

__all__ = ["pairs", "reward_noise"]


def pairs(
    replies: Iterable[environment_pb2.StepResponse | None],
) -> tuple[tuple[float, float], ...]:
    """(reward, resampled reward) of each Step reply the environment measured twice."""
    return tuple(
        (float(reply.reward), float(reply.info.resampled_reward))
        for reply in replies
        if reply is not None and reply.info.resampled
    )


def reward_noise(readings: Sequence[tuple[float, float]]) -> dict[str, float]:
    """The ``noise/*`` scalars of an iteration's pairs of readings (module docs)."""
    out = {"noise/resampled_steps": float(len(readings))}
    if len(readings) < 2:
        return out
    diff_sd = math.sqrt(math.fsum((r - again) ** 2 for r, again in readings) / len(readings))
    sigma = diff_sd / math.sqrt(2.0)
    reward_sd = statistics.stdev(r for r, _ in readings)
    out.update(
        {
            "noise/reward_diff_sd": diff_sd,
            "noise/reward_noise_sd": sigma,
            "noise/reward_sd": reward_sd,
        }
    )
    if sigma > 0.0:
        out["noise/signal_to_noise"] = math.sqrt(max(reward_sd**2 - sigma**2, 0.0)) / sigma
    return out
