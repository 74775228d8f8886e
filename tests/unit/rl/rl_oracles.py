"""Slow, obviously-correct loops that the vectorised rl/ functions are checked against.

Plain Python over rows and tokens, float64, written from the formulas in the issue and the
papers (not from the implementation under test). Also random batch builders with the awkward
cases: singleton groups, all-equal groups, padded and empty rows, repeated anchors.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

# ----------------------------------------------------------------------------- batches


@dataclass
class StepBatch:
    """A batch of agent steps: one row per step."""

    token_level_rewards: np.ndarray  # [rows, tokens]
    step_rewards: np.ndarray  # [rows]
    response_mask: np.ndarray  # [rows, tokens]
    anchor_obs: list[Any]
    index: np.ndarray  # object array of group uids
    traj_index: np.ndarray  # object array of trajectory uids


def random_step_batch(rng: np.random.Generator, *, tokens: int = 7) -> StepBatch:
    """Groups of trajectories with repeated anchors, a singleton group, an all-equal group."""
    rows_index, rows_traj, anchors, step_rewards = [], [], [], []
    n_groups = int(rng.integers(2, 5))
    for g in range(n_groups):
        n_traj = int(rng.integers(1, 5))
        pool = [f"state-{g}-{k}" for k in range(int(rng.integers(1, 4)))]
        for j in range(n_traj):
            for _ in range(int(rng.integers(1, 5))):
                rows_index.append(f"g{g}")
                rows_traj.append(f"g{g}-t{j}")
                anchors.append(str(rng.choice(pool)))
                step_rewards.append(float(rng.normal()))
    # a one-row episode group (singleton at both levels)
    rows_index.append("lonely")
    rows_traj.append("lonely-t0")
    anchors.append("lonely-state")
    step_rewards.append(float(rng.normal()))
    # an all-equal group: equal scores and equal step returns at one anchor
    for j in range(3):
        rows_index.append("flat")
        rows_traj.append(f"flat-t{j}")
        anchors.append("flat-state")
        step_rewards.append(0.25)
    rows = len(rows_index)
    lengths = rng.integers(0, tokens + 1, size=rows)
    lengths[0] = tokens  # one full row
    lengths[1] = 0  # one empty (fully padded) row
    mask = (np.arange(tokens)[None, :] < lengths[:, None]).astype(np.float32)
    token_level_rewards = rng.normal(size=(rows, tokens)).astype(np.float32)
    token_level_rewards[-3:] = token_level_rewards[-3]
    # interleave the rows so trajectories are not contiguous
    order = rng.permutation(rows)
    return StepBatch(
        token_level_rewards=token_level_rewards[order],
        step_rewards=np.asarray(step_rewards, dtype=np.float32)[order],
        response_mask=mask[order],
        anchor_obs=[anchors[i] for i in order],
        index=np.asarray(rows_index, dtype=object)[order],
        traj_index=np.asarray(rows_traj, dtype=object)[order],
    )


# ----------------------------------------------------------------------------- GiGPO


def discounted_returns(rewards: list[float], traj: list[Any], gamma: float) -> list[float]:
    """R_t = r_t + gamma R_{t+1} within each trajectory, rows of a trajectory in batch order."""
    out = [0.0] * len(rewards)
    for uid in dict.fromkeys(traj):
        rows = [i for i in range(len(traj)) if traj[i] == uid]
        running = 0.0
        for i in reversed(rows):
            running = float(rewards[i]) + gamma * running
            out[i] = running
    return out


def _mean_std(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else float("nan")
    return mean, std


def group_relative(
    values: list[float],
    groups: list[Any],
    *,
    by_std: bool,
    epsilon: float,
    singleton_mean_zero: bool,
) -> list[float]:
    """(x - mean_g) [/ (std_g + eps)]; one-row group: mean 0 or its own value, std 1."""
    out = []
    for i, x in enumerate(values):
        members = [values[j] for j in range(len(values)) if groups[j] == groups[i]]
        if len(members) == 1:
            mean, std = (0.0 if singleton_mean_zero else x), 1.0
        else:
            mean, std = _mean_std(members)
        out.append((x - mean) / (std + epsilon) if by_std else x - mean)
    return out


def group_relative_torch(
    values: np.ndarray,
    groups: list[Any],
    *,
    by_std: bool,
    epsilon: float,
    singleton_mean_zero: bool,
) -> np.ndarray:
    """The same, with verl-agent's arithmetic: torch.mean / torch.std of each group in its dtype.

    One group at a time, members in batch order; this is where float32 rounding decides the
    result of an all-equal group in mean_std_norm.
    """
    import torch

    scores = torch.from_numpy(np.array(values))
    out = scores.clone()
    for i in range(len(scores)):
        members = torch.stack([scores[j] for j in range(len(scores)) if groups[j] == groups[i]])
        if len(members) == 1:
            mean = torch.tensor(0.0) if singleton_mean_zero else torch.mean(members)
            std = torch.tensor(1.0)
        else:
            mean, std = torch.mean(members), torch.std(members)
        out[i] = (scores[i] - mean) / (std + epsilon) if by_std else scores[i] - mean
    return out.numpy()


def canonical_anchor(x: Any) -> Any:
    """The anchor equality of the spec: containers by content, dicts by sorted items."""
    if isinstance(x, np.ndarray):
        return tuple(canonical_anchor(v) for v in x.flatten().tolist())
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, list | tuple):
        return tuple(canonical_anchor(v) for v in x)
    if isinstance(x, dict):
        return tuple(sorted((k, canonical_anchor(v)) for k, v in x.items()))
    return x


def step_clusters(
    anchors: list[Any], index: list[Any], *, similarity: bool, thresh: float
) -> list[int]:
    """Cluster id per row: rows of one index group, same anchor (or similar to the first member)."""
    clusters: list[tuple[Any, Any, int]] = []  # (index key, first member's anchor, id)
    out = []
    for obs, key in zip(anchors, index, strict=True):
        for c_key, rep, cid in clusters:
            if c_key != key:
                continue
            if similarity:
                same = difflib.SequenceMatcher(None, obs, rep).ratio() >= thresh
            else:
                same = canonical_anchor(obs) == canonical_anchor(rep)
            if same:
                out.append(cid)
                break
        else:
            clusters.append((key, obs, len(clusters)))
            out.append(len(clusters) - 1)
    return out


def gigpo_advantages_torch(batch: StepBatch, *, w: float = 1.0, mode: str = "mean_norm"):
    """GiGPO with verl-agent's float arithmetic (exact anchors): float32 in, float32 out."""
    import torch

    by_std = mode == "mean_std_norm"
    scores = torch.from_numpy(batch.token_level_rewards).sum(dim=-1).numpy()
    episode = group_relative_torch(
        scores, list(batch.index), by_std=by_std, epsilon=1e-6, singleton_mean_zero=True
    )
    clusters = step_clusters(
        list(batch.anchor_obs), list(batch.index), similarity=False, thresh=1.0
    )
    step = group_relative_torch(
        batch.step_rewards, clusters, by_std=by_std, epsilon=1e-6, singleton_mean_zero=False
    )
    mask = torch.from_numpy(batch.response_mask)
    episode_t = torch.from_numpy(episode)[:, None] * mask
    return (episode_t + w * (torch.from_numpy(step)[:, None] * mask)).numpy()


def as_float64(batch: StepBatch) -> StepBatch:
    """The batch in float64, where rounding noise is far below every tolerance."""
    return StepBatch(
        token_level_rewards=batch.token_level_rewards.astype(np.float64),
        step_rewards=batch.step_rewards.astype(np.float64),
        response_mask=batch.response_mask.astype(np.float64),
        anchor_obs=batch.anchor_obs,
        index=batch.index,
        traj_index=batch.traj_index,
    )


def gigpo_advantages(
    batch: StepBatch,
    *,
    w: float = 1.0,
    mode: str = "mean_norm",
    similarity: bool = False,
    thresh: float = 0.95,
    epsilon: float = 1e-6,
) -> np.ndarray:
    rows, tokens = batch.token_level_rewards.shape
    by_std = mode == "mean_std_norm"
    scores = [sum(float(v) for v in batch.token_level_rewards[i]) for i in range(rows)]
    episode = group_relative(
        scores, list(batch.index), by_std=by_std, epsilon=epsilon, singleton_mean_zero=True
    )
    clusters = step_clusters(
        list(batch.anchor_obs), list(batch.index), similarity=similarity, thresh=thresh
    )
    step = group_relative(
        [float(v) for v in batch.step_rewards],
        clusters,
        by_std=by_std,
        epsilon=epsilon,
        singleton_mean_zero=False,
    )
    out = np.zeros((rows, tokens))
    for i in range(rows):
        for t in range(tokens):
            out[i, t] = (episode[i] + w * step[i]) * batch.response_mask[i, t]
    return out


# ----------------------------------------------------------------------------- GRPO, RLOO


def grpo(tlr: np.ndarray, mask: np.ndarray, index: list[Any], *, by_std: bool) -> np.ndarray:
    scores = [sum(float(v) for v in row) for row in tlr]
    adv = group_relative(scores, index, by_std=by_std, epsilon=1e-6, singleton_mean_zero=True)
    return np.array([[adv[i] * float(m) for m in mask[i]] for i in range(len(adv))])


def rloo(tlr: np.ndarray, mask: np.ndarray, index: list[Any]) -> np.ndarray:
    scores = [sum(float(v) for v in row) for row in tlr]
    out = np.zeros(mask.shape)
    for i, s in enumerate(scores):
        others = [scores[j] for j in range(len(scores)) if index[j] == index[i] and j != i]
        adv = s - sum(others) / len(others) if others else s
        for t in range(mask.shape[1]):
            out[i, t] = adv * float(mask[i, t])
    return out


# ----------------------------------------------------------------------------- GAE


def gae(
    rewards: np.ndarray, values: np.ndarray, mask: np.ndarray, gamma: float, lam: float
) -> tuple[np.ndarray, np.ndarray]:
    rows, tokens = rewards.shape
    adv = np.zeros((rows, tokens))
    for i in range(rows):
        running = 0.0
        for t in reversed(range(tokens)):
            next_value = float(values[i, t + 1]) if t + 1 < tokens else 0.0
            delta = float(rewards[i, t]) + gamma * next_value - float(values[i, t])
            running = delta + gamma * lam * running
            adv[i, t] = running
    returns = adv + values.astype(np.float64)
    valid = [adv[i, t] for i in range(rows) for t in range(tokens) if mask[i, t]]
    mean, std = _mean_std(valid)
    whitened = (adv - mean) / math.sqrt(std**2 + 1e-8)
    return whitened, returns


# ----------------------------------------------------------------------------- PPO, KL


def aggregate(loss: np.ndarray, mask: np.ndarray, mode: str) -> float:
    rows, tokens = loss.shape
    row_sums = [sum(loss[i, t] * mask[i, t] for t in range(tokens)) for i in range(rows)]
    row_counts = [sum(float(mask[i, t]) for t in range(tokens)) for i in range(rows)]
    if mode == "token-mean":
        return sum(row_sums) / sum(row_counts)
    if mode == "seq-mean-token-sum":
        return sum(row_sums) / rows
    if mode == "seq-mean-token-mean":
        means = [s / c for s, c in zip(row_sums, row_counts, strict=True) if c > 0]
        return sum(means) / len(means)
    if mode == "seq-mean-token-sum-norm":
        return sum(row_sums) / tokens
    raise AssertionError(mode)


def policy_loss(
    old: np.ndarray,
    new: np.ndarray,
    adv: np.ndarray,
    mask: np.ndarray,
    *,
    low: float,
    high: float,
    c: float,
    mode: str,
) -> tuple[float, float, float, float]:
    rows, tokens = old.shape
    loss = np.zeros((rows, tokens))
    clipped = np.zeros((rows, tokens))
    lower = np.zeros((rows, tokens))
    kl = np.zeros((rows, tokens))
    for i in range(rows):
        for t in range(tokens):
            a = float(adv[i, t])
            logr = min(max(float(new[i, t] - old[i, t]), -20.0), 20.0)
            r = math.exp(logr)
            unclipped_term = -a * r
            clipped_term = -a * min(max(r, 1 - low), 1 + high)
            value = max(unclipped_term, clipped_term)
            clipped[i, t] = float(clipped_term > unclipped_term)
            if a < 0:
                lower[i, t] = float(value > -a * c)
                value = min(value, -a * c)
            loss[i, t] = value
            kl[i, t] = -logr
    count = float(mask.sum())
    return (
        aggregate(loss, mask, mode),
        float((clipped * mask).sum() / count),
        float((kl * mask).sum() / count),
        float((lower * mask).sum() / count),
    )


def value_loss(
    vpreds: np.ndarray,
    returns: np.ndarray,
    values: np.ndarray,
    mask: np.ndarray,
    clip: float,
    mode: str,
) -> tuple[float, float]:
    rows, tokens = vpreds.shape
    loss = np.zeros((rows, tokens))
    frac = np.zeros((rows, tokens))
    for i in range(rows):
        for t in range(tokens):
            v, ret, old = float(vpreds[i, t]), float(returns[i, t]), float(values[i, t])
            v_clipped = min(max(v, old - clip), old + clip)
            first, second = (v - ret) ** 2, (v_clipped - ret) ** 2
            loss[i, t] = max(first, second)
            frac[i, t] = float(second > first)
    return aggregate(loss, mask, mode), float((frac * mask).sum() / mask.sum())


def kl(logp: float, ref: float, estimator: str) -> float:
    log_ratio = logp - ref
    if estimator == "k1":
        return log_ratio
    if estimator == "abs":
        return abs(log_ratio)
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "low_var_kl":
        return min(max(math.exp(-log_ratio) + log_ratio - 1, -10.0), 10.0)
    raise AssertionError(estimator)


def entropy(logits: list[float]) -> float:
    top = max(logits)
    weights = [math.exp(z - top) for z in logits]
    total = sum(weights)
    return -sum(w / total * math.log(w / total) for w in weights if w > 0)


def candidate_policy_loss(
    old: np.ndarray,
    new: np.ndarray,
    adv: np.ndarray,
    mask: np.ndarray,
    *,
    low: float,
    high: float,
    c: float,
) -> tuple[list[float], float, list[float]]:
    """Per row sum_k pi_old(k) L_k, the pi_old-weighted clip share, and KL(pi_old || pi)."""
    losses, clipped, kls = [], [], []
    for i in range(old.shape[0]):
        row_loss = row_clip = row_kl = 0.0
        for k in range(old.shape[1]):
            if not mask[i, k]:
                continue
            weight = math.exp(float(old[i, k]))
            a = float(adv[i, k])
            logr = min(max(float(new[i, k] - old[i, k]), -20.0), 20.0)
            r = math.exp(logr)
            unclipped_term = -a * r
            clipped_term = -a * min(max(r, 1 - low), 1 + high)
            value = max(unclipped_term, clipped_term)
            if a < 0:
                value = min(value, -a * c)
            row_loss += weight * value
            row_clip += weight * float(clipped_term > unclipped_term)
            row_kl += weight * float(old[i, k] - new[i, k])
        losses.append(row_loss)
        clipped.append(row_clip)
        kls.append(row_kl)
    return losses, sum(clipped) / len(clipped), kls


def sibling_step_advantages(rewards: list[list[float]], *, by_std: bool) -> list[list[float]]:
    """Each row's candidates normalised within the row (a one-candidate row gets 0)."""
    out = []
    for row in rewards:
        if len(row) == 1:
            out.append([0.0])
            continue
        mean = sum(row) / len(row)
        std = math.sqrt(sum((v - mean) ** 2 for v in row) / (len(row) - 1))
        out.append([(v - mean) / (std + 1e-6) if by_std else v - mean for v in row])
    return out
