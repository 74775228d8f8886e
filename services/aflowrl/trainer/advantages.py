"""Advantages (and critic targets) of an iteration's step rows, with :mod:`aflowrl.rl`.

Rows are agent steps (:class:`~aflowrl.trainer.rows.StepRow`); each becomes a training row whose
values (one per response token in text mode, one per decision in choice mode) get the row's
advantage. The estimator is ``learner.algorithm``:

- ``gigpo`` (default; Feng et al., 2025, arXiv 2505.10978), verl-agent's order: discounted step
  returns R_t = r_t + gamma R_{t+1} per episode, the episode's total reward on each row's last
  token, the invalid-action penalty subtracted from both (``rl.gigpo.compute_gigpo_rewards``);
  then A = A_episode + w A_step with episode groups = task seeds and step groups = rows of a
  group at the same anchor workflow (``rl.gigpo.compute_gigpo_advantages``). With
  ``siblingStepGroups``, a row whose state had every listed action stepped
  (``StepRow.candidate_rewards``) keeps A_episode on its sampled action, and its step term
  becomes an advantage for every candidate, w A_step_k with A_step the candidates' one-step
  rewards normalised within the row (``rl.gigpo.compute_sibling_step_advantages``), which the
  learner trains in expectation under pi_old.
- ``grpo`` (Shao et al., 2024, arXiv 2402.03300) or its leave-one-out variant RLOO (Ahmadian
  et al., 2024, arXiv 2402.14740): one score per episode, its discounted return
  G = sum_t gamma^t (r_t - penalty_t), normalised within the episode's group
  (``rl.grpo``); every row of the episode gets its episode's advantage.
- ``ppo`` with a critic: GAE (Schulman et al., 2016, arXiv 1506.02438) over the *steps* of each
  episode, delta_t = r_t - penalty_t + gamma V(s_{t+1}) - V(s_t), with V(s_t) the critic's value
  at the step's first response position, whitened over the batch (``rl.gae``); the critic's
  targets are the returns A_t + V(s_t) on every value of the row.

Every algorithm also gives each row the target of the policy's own value
(``policy.value``): the step's discounted return R_t = (r_t - penalty_t) + gamma R_{t+1}. It
trains the value the search fuses with UCB; it is not part of any advantage.

Pure functions of the rows (numpy; no torch), tested against hand-computed cases.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from aflowrl.config.learner import GiGPOSpec, GRPOSpec, PPOSpec
from aflowrl.errors import InvalidInputError
from aflowrl.rl import gae, gigpo, grpo
from aflowrl.trainer.rows import StepRow

AlgorithmSpec = GiGPOSpec | GRPOSpec | PPOSpec


@dataclass(frozen=True)
class RowTargets:
    """Per-row training targets, each tuple as wide as the row's decision."""

    advantages: list[tuple[float, ...]]
    returns: list[tuple[float, ...]] | None = None
    """Critic targets (ppo only)."""
    old_values: list[tuple[float, ...]] | None = None
    """Critic values at collection time (ppo only)."""
    value_targets: list[float] | None = None
    """Per row, the discounted return R_t (the policy's value target)."""
    candidate_advantages: list[tuple[float, ...]] | None = None
    """Per row, an advantage for every candidate (GiGPO's sibling step groups; empty tuples
    for rows without siblings); None when no row has siblings."""


def _widths(rows: Sequence[StepRow]) -> list[int]:
    return [row.decision.width for row in rows]


def _mask(widths: Sequence[int]) -> NDArray[np.float64]:
    mask = np.zeros((len(widths), max(1, *widths) if widths else 1))
    for i, width in enumerate(widths):
        mask[i, :width] = 1.0
    return mask


def _per_row(matrix: NDArray[np.floating], widths: Sequence[int]) -> list[tuple[float, ...]]:
    return [tuple(float(v) for v in matrix[i, :width]) for i, width in enumerate(widths)]


def _penalised(rows: Sequence[StepRow], penalty: float) -> NDArray[np.float64]:
    """r_t - penalty * (1 - valid_t)."""
    rewards = np.array([row.reward for row in rows], dtype=np.float64)
    invalid = np.array([0.0 if row.valid else 1.0 for row in rows])
    return rewards - penalty * invalid


def compute_advantages(
    rows: Sequence[StepRow],
    algorithm: AlgorithmSpec,
    *,
    values: Sequence[Sequence[float]] | None = None,
) -> RowTargets:
    """The targets of ``rows`` under ``algorithm`` (module docstring).

    ``values`` (ppo only) holds the critic's values of each row, as wide as the row.
    """
    if not rows:
        return RowTargets([])
    if isinstance(algorithm, GiGPOSpec):
        targets = _gigpo(rows, algorithm)
    elif isinstance(algorithm, GRPOSpec):
        targets = _grpo(rows, algorithm)
    else:
        if values is None or len(values) != len(rows):
            raise InvalidInputError("ppo needs one critic value list per row", field="values")
        targets = _ppo(rows, algorithm, values)
    return dataclasses.replace(targets, value_targets=value_targets(rows, algorithm))


def value_targets(rows: Sequence[StepRow], algorithm: AlgorithmSpec) -> list[float]:
    """R_t = (r_t - penalty_t) + gamma R_{t+1} per episode (the policy's value target)."""
    traj = [row.traj for row in rows]
    penalised = _penalised(rows, algorithm.invalid_action_penalty)
    returns = gigpo.compute_step_discounted_returns(penalised, traj, algorithm.gamma)
    return [float(v) for v in returns]


def _gigpo(rows: Sequence[StepRow], spec: GiGPOSpec) -> RowTargets:
    widths = _widths(rows)
    mask = _mask(widths)
    traj = [row.traj for row in rows]
    rewards = np.array([row.reward for row in rows], dtype=np.float64)
    shaped = gigpo.compute_gigpo_rewards(
        rewards,
        traj,
        mask,
        np.array([row.valid for row in rows]),
        gamma=spec.gamma,
        invalid_action_penalty_coef=spec.invalid_action_penalty,
    )

    def advantages(step_w: float) -> NDArray[np.floating]:
        return np.asarray(
            gigpo.compute_gigpo_advantages(
                shaped.token_level_rewards,
                shaped.step_rewards,
                mask,
                [row.anchor for row in rows],
                [row.group for row in rows],
                traj,
                step_advantage_w=step_w,
                mode=spec.mode,
                enable_similarity=spec.enable_similarity,
                similarity_thresh=spec.similarity_thresh,
            )
        )

    full = advantages(spec.step_advantage_w)
    siblings = [i for i, row in enumerate(rows) if _has_siblings(row)]
    if not siblings:
        return RowTargets(_per_row(full, widths))
    episode_only = advantages(0.0)
    full[siblings] = episode_only[siblings]
    step = gigpo.compute_sibling_step_advantages(
        [rows[i].candidate_rewards for i in siblings], mode=spec.mode
    )
    candidate: list[tuple[float, ...]] = [() for _ in rows]
    for i, values in zip(siblings, step, strict=True):
        candidate[i] = tuple(float(spec.step_advantage_w * v) for v in values)
    return RowTargets(_per_row(full, widths), candidate_advantages=candidate)


def _has_siblings(row: StepRow) -> bool:
    """Whether every listed action of the row's state was stepped (sibling step groups)."""
    count = len(row.decision.candidate_ids)
    return row.decision.is_choice and count > 1 and len(row.candidate_rewards) == count


def _first_rows(rows: Sequence[StepRow]) -> dict[int, int]:
    """Row index of each episode's first step."""
    first: dict[int, int] = {}
    for i, row in enumerate(rows):
        if row.traj not in first or row.step < rows[first[row.traj]].step:
            first[row.traj] = i
    return first


def _grpo(rows: Sequence[StepRow], spec: GRPOSpec) -> RowTargets:
    widths = _widths(rows)
    traj = [row.traj for row in rows]
    step_returns = gigpo.compute_step_discounted_returns(
        _penalised(rows, spec.invalid_action_penalty), traj, spec.gamma
    )
    first = _first_rows(rows)
    episodes = sorted(first)
    scores = np.array([[step_returns[first[t]]] for t in episodes], dtype=np.float64)
    ones = np.ones_like(scores)
    groups = [rows[first[t]].group for t in episodes]
    if spec.leave_one_out:
        episode_adv, _ = grpo.compute_rloo_outcome_advantage(scores, ones, groups)
    else:
        episode_adv, _ = grpo.compute_grpo_outcome_advantage(
            scores, ones, groups, norm_adv_by_std=spec.norm_by_std
        )
    by_traj = {t: float(episode_adv[k, 0]) for k, t in enumerate(episodes)}
    return RowTargets([(by_traj[row.traj],) * w for row, w in zip(rows, widths, strict=True)])


def _ppo(rows: Sequence[StepRow], spec: PPOSpec, values: Sequence[Sequence[float]]) -> RowTargets:
    widths = _widths(rows)
    rewards = _penalised(rows, spec.invalid_action_penalty)
    episodes = sorted({row.traj for row in rows})
    slot = {t: k for k, t in enumerate(episodes)}
    order = sorted(range(len(rows)), key=lambda i: (rows[i].traj, rows[i].step))
    position: dict[int, tuple[int, int]] = {}
    lengths = [0] * len(episodes)
    for i in order:
        k = slot[rows[i].traj]
        position[i] = (k, lengths[k])
        lengths[k] += 1
    shape = (len(episodes), max(lengths))
    step_rewards, step_values, step_mask = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    for i, (k, t) in position.items():
        step_rewards[k, t] = rewards[i]
        step_values[k, t] = float(values[i][0]) if len(values[i]) else 0.0
        step_mask[k, t] = 1.0
    advantages, returns = gae.compute_gae_advantage_return(
        step_rewards, step_values, step_mask, spec.gamma, spec.lam
    )
    adv_rows, ret_rows, old_rows = [], [], []
    for i, width in enumerate(widths):
        k, t = position[i]
        adv_rows.append((float(advantages[k, t]),) * width)
        ret_rows.append((float(returns[k, t]),) * width)
        old_rows.append(tuple(float(v) for v in values[i][:width]))
    return RowTargets(adv_rows, ret_rows, old_rows)
