"""PPO losses as verl computes them: clipped policy loss with dual clip, value loss, entropy.

- Policy (Schulman et al., 2017, arXiv 1707.06347; dual clip: Ye et al., 2020,
  arXiv 1912.09729; asymmetric clip-higher: DAPO, arXiv 2503.14476):
  r = exp(logp - logp_old), L = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)), and for
  A < 0, L = min(L, -A c). verl's ``compute_policy_loss``, including its clamp of
  logp - logp_old to [-20, 20] before the exponential.
- Value (the PPO2 clipped value loss): max((V - R)^2, (clip(V, V_old - e, V_old + e) - R)^2),
  verl-agent's ``compute_value_loss`` (no 1/2 factor; the learner's coefficient scales it).
- Aggregation of a [rows, tokens] loss (verl's ``agg_loss``): ``token-mean``,
  ``seq-mean-token-sum``, ``seq-mean-token-mean``, ``seq-mean-token-sum-norm`` (Dr. GRPO,
  arXiv 2503.20783: token sums divided by the padded length).
- Entropy of the token distribution from logits.
- All-action surrogate of a choice among candidates (:func:`compute_candidate_policy_loss`):
  with an advantage for every candidate k (GiGPO's sibling step groups), the sampled surrogate
  r_a A_a is replaced by its expectation under the behaviour policy,
  sum_k pi_old(k) max(-A_k r_k, -A_k clip(r_k)) (with the dual clip), whose gradient is the
  exact policy gradient at that state (a Rao-Blackwellised estimator; "mean actor-critic",
  Allen et al., 2017, arXiv 1709.00503).

torch only (autograd flows through every loss). Called by the learner in each micro-batch.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, get_args

import torch

from aflowrl.rl.errors import RLInputError

__all__ = [
    "CandidateLoss",
    "LossAggMode",
    "PolicyLoss",
    "ValueLoss",
    "agg_loss",
    "compute_candidate_policy_loss",
    "compute_entropy_loss",
    "compute_policy_loss",
    "compute_value_loss",
    "entropy_from_logits",
    "masked_mean",
]

LossAggMode = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]
"""How a [rows, tokens] loss becomes a scalar (see :func:`agg_loss`)."""

_LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)


class PolicyLoss(NamedTuple):
    """The clipped policy loss and its diagnostics (the metrics are detached)."""

    pg_loss: torch.Tensor
    """Scalar loss to minimise (differentiable in ``log_prob``)."""
    pg_clipfrac: torch.Tensor
    """Fraction of response tokens where the clipped term was the active one."""
    ppo_kl: torch.Tensor
    """approx_kl: mean of logp_old - logp over response tokens (k1 estimate of KL(old||new))."""
    pg_clipfrac_lower: torch.Tensor
    """Fraction of response tokens where the dual clip (-A c, A < 0) was active."""


class ValueLoss(NamedTuple):
    """The clipped value loss and its diagnostic (detached)."""

    vf_loss: torch.Tensor
    """Scalar loss to minimise (differentiable in ``vpreds``)."""
    vf_clipfrac: torch.Tensor
    """Fraction of response tokens where the clipped prediction gave the larger error."""


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(x m) / sum(m), over everything or along ``dim`` (verl's ``masked_mean``).

    An all-zero mask gives 0, as verl's ``/ (sum(m) + 1e-8)`` does, without that epsilon's
    bias (1e-8 relative, visible in float64).
    """
    total = (values * mask).sum() if dim is None else (values * mask).sum(dim=dim)
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return total / torch.where(count > 0, count, torch.ones_like(count))


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """Aggregate a [rows, tokens] loss into a scalar, as verl's ``agg_loss``.

    - ``token-mean``: sum_{i,t} m L / sum_{i,t} m (every token weighs the same);
    - ``seq-mean-token-sum``: mean_i sum_t m L;
    - ``seq-mean-token-mean``: mean_i (sum_t m L / sum_t m), over the rows with at least one
      token (verl divides 0 by 0 for an empty row and returns NaN);
    - ``seq-mean-token-sum-norm``: sum_{i,t} m L / tokens, the padded length (Dr. GRPO's
      constant normaliser).
    """
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    if loss_agg_mode == "seq-mean-token-sum":
        return torch.sum(loss_mat * loss_mask, dim=-1).mean()
    if loss_agg_mode == "seq-mean-token-mean":
        token_counts = torch.sum(loss_mask, dim=-1)
        has_tokens = token_counts > 0
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / torch.where(
            has_tokens, token_counts, 1
        )
        return torch.sum(seq_losses * has_tokens) / torch.clamp(has_tokens.sum(), min=1)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return torch.sum(loss_mat * loss_mask) / loss_mask.shape[-1]
    raise RLInputError(
        f"must be one of {list(_LOSS_AGG_MODES)}, got {loss_agg_mode!r}", field="loss_agg_mode"
    )


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
) -> PolicyLoss:
    """PPO clipped policy loss with dual clip; all tensors [rows, tokens].

    r = exp(logp - logp_old); L1 = -A r; L2 = -A clip(r, 1 - eps_low, 1 + eps_high);
    L = max(L1, L2); for A < 0, L = min(L, -A c); then :func:`agg_loss` over response tokens.
    """
    logratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    approx_kl = masked_mean(-logratio, response_mask)
    clipped = _clipped_surrogate(
        torch.exp(logratio), advantages, clip_ratio_low, clip_ratio_high, clip_ratio_c
    )
    clipfrac = masked_mean(clipped.upper.float(), response_mask)
    clipfrac_lower = masked_mean(clipped.lower.float(), response_mask)
    pg_loss = agg_loss(clipped.losses, response_mask, loss_agg_mode)
    return PolicyLoss(pg_loss, clipfrac.detach(), approx_kl.detach(), clipfrac_lower.detach())


class _Clipped(NamedTuple):
    losses: torch.Tensor
    """Elementwise dual-clipped PPO loss."""
    upper: torch.Tensor
    """Where the clipped term was the larger one (verl's clipfrac)."""
    lower: torch.Tensor
    """Where the dual clip -A c bounded a negative advantage's loss."""


def _clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
) -> _Clipped:
    """L = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)); for A < 0, min(L, -A c)."""
    if clip_ratio_c <= 1.0:
        raise RLInputError(
            f"the dual-clip bound must be > 1, got {clip_ratio_c}", field="clip_ratio_c"
        )
    if not 0.0 <= clip_ratio_low < 1.0:
        raise RLInputError(f"must be in [0, 1), got {clip_ratio_low}", field="clip_ratio_low")
    if clip_ratio_high < 0.0:
        raise RLInputError(f"must be >= 0, got {clip_ratio_high}", field="clip_ratio_high")
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped_loss = torch.maximum(pg_loss1, pg_loss2)
    pg_loss3 = -advantages * clip_ratio_c
    dual_clipped_loss = torch.minimum(pg_loss3, clipped_loss)
    lower = torch.gt(clipped_loss, pg_loss3) & (advantages < 0)
    losses = torch.where(advantages < 0, dual_clipped_loss, clipped_loss)
    return _Clipped(losses, torch.gt(pg_loss2, pg_loss1), lower)


class CandidateLoss(NamedTuple):
    """The all-action surrogate of choice rows and its diagnostics (metrics detached)."""

    losses: torch.Tensor
    """[rows]: sum_k pi_old(k) L_k, differentiable in ``log_probs``."""
    clipfrac: torch.Tensor
    """pi_old-weighted share of candidates whose clipped term was active, mean over rows."""
    kl: torch.Tensor
    """[rows]: the exact KL(pi_old || pi) over each row's candidates (detached)."""


def compute_candidate_policy_loss(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    candidate_mask: torch.Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float = 3.0,
) -> CandidateLoss:
    """The expected clipped surrogate over every candidate; all tensors [rows, K].

    r_k = exp(log pi(k) - log pi_old(k)) (clamped to [-20, 20] before the exponential, as
    :func:`compute_policy_loss`), L_k the dual-clipped PPO loss of (r_k, A_k), and the row's
    loss sum_k pi_old(k) L_k over its candidates (``candidate_mask``; padded entries may hold
    anything, -inf included). Its gradient is sum_k pi(k) A_k grad log pi(k) while no clip is
    active: the exact policy gradient at the state, where the sampled surrogate estimates it
    from one action.
    """
    if not (old_log_probs.shape == log_probs.shape == advantages.shape == candidate_mask.shape):
        raise RLInputError(
            "expected old_log_probs, log_probs, advantages and candidate_mask of one shape "
            f"[rows, K], got {list(old_log_probs.shape)}, {list(log_probs.shape)}, "
            f"{list(advantages.shape)} and {list(candidate_mask.shape)}",
            field="candidate_mask",
        )
    mask = candidate_mask.bool()
    zero = torch.zeros_like(log_probs)
    old = torch.where(mask, old_log_probs, zero)
    new = torch.where(mask, log_probs, zero)
    adv = torch.where(mask, advantages, zero)
    weights = torch.where(mask, old.exp(), zero).detach()
    logratio = torch.clamp(new - old, min=-20.0, max=20.0)
    clipped = _clipped_surrogate(
        torch.exp(logratio), adv, clip_ratio_low, clip_ratio_high, clip_ratio_c
    )
    losses = (weights * clipped.losses).sum(dim=-1)
    clipfrac = (weights * clipped.upper.float()).sum(dim=-1).mean()
    kl = (weights * (old - new)).sum(dim=-1)
    return CandidateLoss(losses, clipfrac.detach(), kl.detach())


def compute_value_loss(  # noqa: PLR0917 (verl's positional order, CONTRACTS.md)
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
) -> ValueLoss:
    """Clipped value loss; all tensors [rows, tokens].

    V_clip = clip(V, V_old - e, V_old + e); L = max((V - R)^2, (V_clip - R)^2); then
    :func:`agg_loss` over response tokens.
    """
    if cliprange_value < 0.0:
        raise RLInputError(f"must be >= 0, got {cliprange_value}", field="cliprange_value")
    vpredclipped = torch.maximum(
        torch.minimum(vpreds, values + cliprange_value), values - cliprange_value
    )
    vf_loss1 = (vpreds - returns) ** 2
    vf_loss2 = (vpredclipped - returns) ** 2
    clipped_vf_losses = torch.maximum(vf_loss1, vf_loss2)
    vf_loss = agg_loss(clipped_vf_losses, response_mask, loss_agg_mode)
    vf_clipfrac = masked_mean(torch.gt(vf_loss2, vf_loss1).float(), response_mask)
    return ValueLoss(vf_loss, vf_clipfrac.detach())


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last axis: H = logsumexp(z) - sum_v p_v z_v."""
    pd = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)


def compute_entropy_loss(
    logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """Token entropies of [rows, tokens, vocab] logits, aggregated by :func:`agg_loss`."""
    return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode)
