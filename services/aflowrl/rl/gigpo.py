"""GiGPO advantages: episode-level groups plus anchor-state step-level groups.

Group-in-Group Policy Optimization (Feng et al., 2025, arXiv 2505.10978), exactly as
verl-agent implements it (``gigpo/core_gigpo.py``), so results can be compared with it. One row
is one agent step (one policy response); ``index`` names the row's episode group (the n
trajectories started from one task) and ``traj_index`` its trajectory.

- Episode level (Eq. 3): s_i = sum_t token_level_rewards[i, t]; statistics over *all step rows*
  of the index group (not one value per trajectory); unbiased std; a one-row group keeps mean 0
  and std 1. ``mean_norm``: s_i - mean; ``mean_std_norm``: (s_i - mean) / (std + eps).
- Step level (Eq. 6-7): rows of one index group whose anchor observations are equal form a step
  group (optionally: similar, see :func:`build_step_groups`); the same normalisation of the
  discounted step returns, where a one-row step group gets 0.
- A_i = A_episode_i + w A_step_i (Eq. 8), on every response token of the row, zero elsewhere.
- Sibling step groups (:func:`compute_sibling_step_advantages`; this project's extension, for a
  stateless environment): when every listed action of a visited state was stepped, that state's
  step group is its listed actions, each once with its exact one-step reward, normalised the
  same way; the learner then trains every candidate with its own step advantage.

Step returns come from :func:`compute_step_discounted_returns` (Eq. 5), and the trainer's order
(returns, then the invalid-action penalty on both levels) is :func:`compute_gigpo_rewards`.
numpy or torch in, same out, with no Python loop over tokens. Scores keep the caller's dtype and
group statistics are reduced the way torch reduces them in verl-agent (:mod:`aflowrl.rl._groups`):
in float32, a group of equal scores under ``mean_std_norm`` gives verl-agent's answer, the
rounding error of the mean divided by eps, rather than 0. Called by the trainer after each batch
of episodes.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Hashable, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np
from numpy.typing import NDArray

from aflowrl.rl import rewards as _rewards
from aflowrl.rl._backend import (
    Array,
    ArrayT,
    Keys,
    broadcast_rows,
    check_length,
    check_shape,
    factorize,
    keys_of,
    like,
    row_sums,
    rows_tokens,
    to_native,
    to_numpy,
)
from aflowrl.rl._groups import group_normalise
from aflowrl.rl.errors import RLInputError

__all__ = [
    "GiGPOMode",
    "GiGPORewards",
    "build_step_groups",
    "compute_gigpo_advantages",
    "compute_gigpo_rewards",
    "compute_sibling_step_advantages",
    "compute_step_discounted_returns",
]

logger = logging.getLogger(__name__)

GiGPOMode = Literal["mean_norm", "mean_std_norm"]
"""Group normalisation: subtract the group mean, or also divide by the group std (+ eps)."""

_MODES: tuple[str, ...] = ("mean_norm", "mean_std_norm")


def compute_step_discounted_returns(rewards: ArrayT, traj_index: Keys, gamma: float) -> ArrayT:
    """Discounted return of every step within its trajectory (GiGPO Eq. 5).

    R_t = r_t + gamma R_{t+1}, with R after a trajectory's last row = 0. A trajectory's rows are
    taken in batch order (they need not be contiguous); the result is in batch order.
    """
    if not 0.0 <= gamma <= 1.0:
        raise RLInputError(f"must be in [0, 1], got {gamma}", field="gamma")
    step_rewards = to_numpy(rewards, field="rewards")
    if step_rewards.ndim != 1:
        raise RLInputError(f"expected [rows], got {list(step_rewards.shape)}", field="rewards")
    traj_codes, n_traj = factorize(keys_of(traj_index, field="traj_index"), field="traj_index")
    check_length(traj_codes, len(step_rewards), field="traj_index")
    order = np.argsort(traj_codes, kind="stable")
    lengths = np.bincount(traj_codes, minlength=n_traj)
    starts = np.cumsum(lengths) - lengths
    returns = np.zeros_like(step_rewards)
    running = np.zeros(n_traj)
    for t in range(int(lengths.max(initial=0)) - 1, -1, -1):
        alive = lengths > t
        rows = order[starts[alive] + t]
        running[alive] = step_rewards[rows] + gamma * running[alive]
        returns[rows] = running[alive]
    return like(returns, rewards)


def build_step_groups(
    anchor_obs: Sequence[Any] | NDArray[Any],
    index: Keys,
    *,
    enable_similarity: bool = False,
    similarity_thresh: float = 0.95,
) -> NDArray[np.int64]:
    """Step-group code of every row (GiGPO Eq. 6): rows of one index group at the same anchor.

    Exact mode: anchors are equal when their hashable forms are (strings, numbers, bools, numpy
    scalars and arrays, nested lists/tuples/dicts; dicts by sorted items), as verl-agent's
    ``to_hashable``. Similarity mode (text anchors only): within each index group, rows in batch
    order join the first cluster whose *first member* ``rep`` has
    ``difflib.SequenceMatcher(None, obs, rep).ratio() >= similarity_thresh``, else open a new
    cluster. Codes count clusters in order of first appearance.
    """
    index_codes, _ = factorize(keys_of(index, field="index"), field="index")
    return _step_groups(anchor_obs, index_codes, enable_similarity, similarity_thresh)


def _step_groups(
    anchor_obs: Sequence[Any] | NDArray[Any],
    index_codes: NDArray[np.int64],
    enable_similarity: bool,
    similarity_thresh: float,
) -> NDArray[np.int64]:
    anchors = keys_of(anchor_obs, field="anchor_obs")
    check_length(anchors, len(index_codes), field="anchor_obs")
    if not enable_similarity:
        keys = [
            (code, _hashable(obs, row))
            for row, (code, obs) in enumerate(zip(index_codes.tolist(), anchors, strict=True))
        ]
        return factorize(keys, field="anchor_obs")[0]
    if not 0.0 < similarity_thresh <= 1.0:
        raise RLInputError(f"must be in (0, 1], got {similarity_thresh}", field="similarity_thresh")
    return _similarity_clusters(anchors, index_codes.tolist(), similarity_thresh)


def compute_gigpo_advantages(  # noqa: PLR0917 (verl-agent's positional order, CONTRACTS.md)
    token_level_rewards: ArrayT,
    step_rewards: Array,
    response_mask: Array,
    anchor_obs: Sequence[Any] | NDArray[Any],
    index: Keys,
    traj_index: Keys,
    *,
    step_advantage_w: float = 1.0,
    mode: GiGPOMode = "mean_norm",
    enable_similarity: bool = False,
    similarity_thresh: float = 0.95,
    epsilon: float = 1e-6,
) -> ArrayT:
    """GiGPO advantages A = A_episode + w A_step, shape [rows, response tokens] (Eq. 3, 7, 8).

    Args:
        token_level_rewards: [rows, tokens]; a row's episode score is the sum of its row
            (padding included, as verl-agent sums it).
        step_rewards: [rows], the discounted step returns (:func:`compute_step_discounted_returns`,
            after the invalid-action penalty).
        response_mask: [rows, tokens], 1 on response tokens; the advantage is zero elsewhere.
        anchor_obs: one anchor observation per row (GiGPO's anchor state), see
            :func:`build_step_groups`.
        index: episode-group key per row; statistics are taken over all rows of a group.
        traj_index: trajectory key per row (validated; the statistics span steps, as in
            verl-agent's default, so it does not change the result).
        step_advantage_w: w, the weight of the step-level advantage.
        mode: ``mean_norm`` (s - mean) or ``mean_std_norm`` ((s - mean) / (std + epsilon)).
        enable_similarity, similarity_thresh: similarity clustering of text anchors.
        epsilon: added to the std in ``mean_std_norm``.

    Returns:
        The advantages, in ``token_level_rewards``' framework, device and float dtype.
    """
    if mode not in _MODES:
        raise RLInputError(f"must be one of {list(_MODES)}, got {mode!r}", field="mode")
    shape = rows_tokens(token_level_rewards, field="token_level_rewards")
    rows = shape[0]
    check_shape(response_mask, shape, field="response_mask")
    check_shape(step_rewards, (rows,), field="step_rewards")
    check_length(keys_of(traj_index, field="traj_index"), rows, field="traj_index")
    by_std = mode == "mean_std_norm"
    index_codes, n_groups = factorize(keys_of(index, field="index"), field="index")
    check_length(index_codes, rows, field="index")
    step_codes = _step_groups(anchor_obs, index_codes, enable_similarity, similarity_thresh)
    scores = row_sums(token_level_rewards, field="token_level_rewards")
    episode_advantages = group_normalise(
        scores, index_codes, n_groups, by_std=by_std, epsilon=epsilon, singleton_mean_zero=True
    )
    step_returns = to_native(step_rewards, field="step_rewards")
    n_step_groups = int(step_codes.max(initial=-1)) + 1
    step_advantages = group_normalise(
        step_returns,
        step_codes,
        n_step_groups,
        by_std=by_std,
        epsilon=epsilon,
        singleton_mean_zero=False,
    )
    advantages = episode_advantages + step_advantage_w * step_advantages
    logger.debug("GiGPO: %d episode groups, %d step groups, %d rows", n_groups, n_step_groups, rows)
    return broadcast_rows(advantages, response_mask, token_level_rewards)


def compute_sibling_step_advantages(
    candidate_rewards: Sequence[Sequence[float]],
    *,
    mode: GiGPOMode = "mean_norm",
    epsilon: float = 1e-6,
) -> list[NDArray[np.float64]]:
    """Step advantages of sibling step groups: one group per row, its listed actions' rewards.

    For row i with candidate rewards r_i1 .. r_iK (every listed action stepped from the row's
    state), A_step_ik = r_ik - mean_k r_ik (``mean_norm``) or that over the group's unbiased std
    plus ``epsilon`` (``mean_std_norm``); a one-candidate group gets 0, as a one-row step group
    does. Returns one float64 array per row (K_i values).
    """
    if mode not in _MODES:
        raise RLInputError(f"must be one of {list(_MODES)}, got {mode!r}", field="mode")
    widths = [len(r) for r in candidate_rewards]
    if not widths:
        return []
    if min(widths) < 1:
        raise RLInputError("every row needs at least one candidate", field="candidate_rewards")
    flat = np.asarray([float(v) for r in candidate_rewards for v in r], dtype=np.float64)
    if not np.isfinite(flat).all():
        raise RLInputError("rewards must be finite", field="candidate_rewards")
    codes = np.repeat(np.arange(len(widths), dtype=np.int64), widths)
    advantages = group_normalise(
        flat,
        codes,
        len(widths),
        by_std=mode == "mean_std_norm",
        epsilon=epsilon,
        singleton_mean_zero=False,
    )
    return [np.asarray(a, dtype=np.float64) for a in np.split(advantages, np.cumsum(widths)[:-1])]


class GiGPORewards(NamedTuple):
    """What :func:`compute_gigpo_advantages` takes, in the trainer's order."""

    token_level_rewards: Any
    """[rows, tokens]: episode score on each row's last response token, minus the penalty."""
    step_rewards: Any
    """[rows]: discounted step returns minus the penalty."""


def compute_gigpo_rewards(
    rewards: ArrayT,
    traj_index: Keys,
    response_mask: ArrayT,
    is_action_valid: Array | Sequence[bool] | None = None,
    *,
    gamma: float,
    invalid_action_penalty_coef: float = 0.1,
) -> GiGPORewards:
    """The trainer's order before GiGPO, as verl-agent's trainer runs it.

    1. R_t = r_t + gamma R_{t+1} per trajectory (:func:`compute_step_discounted_returns`);
    2. episode score = sum of the trajectory's rewards on each row's last response token
       (:func:`aflowrl.rl.rewards.episode_token_level_scores`);
    3. for invalid actions, coef is subtracted from both the step return (after discounting)
       and the episode score (:func:`aflowrl.rl.rewards.apply_invalid_action_penalty`).

    ``rewards`` are the environment's per-step rewards [rows]; without ``is_action_valid``
    every action counts as valid.
    """
    step_returns = compute_step_discounted_returns(rewards, traj_index, gamma)
    token_scores = _rewards.episode_token_level_scores(rewards, traj_index, response_mask)
    if is_action_valid is None:
        return GiGPORewards(token_scores, step_returns)
    token_scores, step_returns = _rewards.apply_invalid_action_penalty(
        token_scores, step_returns, response_mask, is_action_valid, coef=invalid_action_penalty_coef
    )
    return GiGPORewards(token_scores, step_returns)


def _hashable(obs: Any, row: int) -> Hashable:
    try:
        return _to_hashable(obs)
    except TypeError as exc:
        raise RLInputError(str(exc), field=f"anchor_obs[{row}]") from exc


def _to_hashable(x: Any) -> Hashable:
    """verl-agent's ``to_hashable``: the same equality, so the same step groups."""
    if isinstance(x, int | float | str | bool):
        return x
    if isinstance(x, np.integer | np.floating):
        return x.item()
    if isinstance(x, np.ndarray):
        return tuple(x.flatten().tolist())
    if isinstance(x, list | tuple):
        return tuple(_to_hashable(item) for item in x)
    if isinstance(x, dict):
        return tuple(sorted((key, _to_hashable(value)) for key, value in x.items()))
    raise TypeError(f"unsupported anchor type {type(x).__name__}")


def _similarity_clusters(
    anchors: list[Any], index_codes: list[int], threshold: float
) -> NDArray[np.int64]:
    """Greedy clustering in batch order against each cluster's first member.

    A text seen before in the same index group goes where it went then: the comparisons that
    placed it give the same answers again (clusters are only appended), and a cluster's first
    member matches itself (identical texts have ratio 1.0, autojunk or not).
    """
    codes = np.empty(len(anchors), dtype=np.int64)
    clusters_by_group: dict[int, list[tuple[difflib.SequenceMatcher[str], int]]] = {}
    settled: dict[tuple[int, str], int] = {}
    n_clusters = 0
    for row, (group, obs) in enumerate(zip(index_codes, anchors, strict=True)):
        if not isinstance(obs, str):
            raise RLInputError(
                f"similarity grouping needs text anchors, got {type(obs).__name__}",
                field=f"anchor_obs[{row}]",
            )
        if (group, obs) in settled:
            codes[row] = settled[group, obs]
            continue
        clusters = clusters_by_group.setdefault(group, [])
        code = next((c for matcher, c in clusters if _similar(matcher, obs, threshold)), None)
        if code is None:
            code = n_clusters
            n_clusters += 1
            clusters.append((difflib.SequenceMatcher(None, obs, obs), code))
        settled[group, obs] = code
        codes[row] = code
    return codes


def _similar(matcher: difflib.SequenceMatcher[str], obs: str, threshold: float) -> bool:
    """SequenceMatcher(None, obs, rep).ratio() >= threshold, with rep the matcher's seq2."""
    matcher.set_seq1(obs)
    # real_quick_ratio() and quick_ratio() bound ratio() from above: testing them first never
    # changes the answer, only the time.
    return (
        matcher.real_quick_ratio() >= threshold
        and matcher.quick_ratio() >= threshold
        and matcher.ratio() >= threshold
    )
