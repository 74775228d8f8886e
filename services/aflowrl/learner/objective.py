"""The learner's loss on one micro-batch, assembled from :mod:`aflowrl.rl` (no formula redone).

    L = L_policy + kl_coef * L_kl - entropy_coef * H (+ value_loss_coef * L_value with a critic)
        (+ policy.value.lossCoef * L_bins when rows carry value replies)

with L_policy the clipped PPO loss with dual clip (``rl.ppo.compute_policy_loss``) plus, on choice
rows with an advantage for every candidate (GiGPO's sibling step groups), the all-action
surrogate sum_k pi_old(k) L_k (``rl.ppo.compute_candidate_policy_loss``), L_kl the KL
estimator to the reference (``rl.kl.kl_penalty``; ``exact``: a choice row's KL over its
candidates, ``rl.choice.categorical_kl``) and H the entropy, each aggregated over response
tokens by ``rl.ppo.agg_loss`` in ``learner.loss.lossAggMode``. L_bins is the policy's own value
(its ``<value>b`` replies, :mod:`aflowrl.search.encoding`) trained by cross-entropy against the
two-hot projection of the step's discounted return on the bin centres
(``rl.choice.bin_cross_entropy``, ``rl.candidates.two_hot``), averaged over the rows that carry
value replies.

**Supervised warm start** (``OBJECTIVE_SFT``): L = L_sft + policy.value.lossCoef * L_bins,
with L_sft the mean over rows of the cross-entropy to the row's target: -sum_k w_k log pi_k over
a choice row's candidates, the mean token negative log-likelihood of a text row's response
(:func:`sft_micro_loss`).

**Global normalisation.** ``agg_loss`` averages over the rows it is given; a mini-batch is split
over micro-batches and ranks, so each micro-batch's loss is weighted by its share of the
mini-batch in the unit the mode averages over::

    token-mean               weight = tokens_micro / tokens_minibatch
    seq-mean-token-sum|mean  weight = rows_micro / rows_minibatch
    seq-mean-token-sum-norm  weight = 1   (a sum over rows divided by a fixed padded length)

The sum of the weighted micro-batch losses over micro-batches and ranks is then exactly the loss
of the whole mini-batch in one piece, whatever the number of ranks or micro-batches; every
micro-batch is padded to the mini-batch's widest row so the ``-norm`` mode's divisor is fixed.
FSDP averages gradients over ranks, so the backward pass uses ``world_size * weight``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from aflowrl.config.learner import PolicyLossSpec
from aflowrl.learner.batching import RowOutput, TrainRow, pad_rows
from aflowrl.rl import candidates, choice, kl, ppo

STAT_NAMES = (
    "losses/total",
    "losses/policy",
    "losses/kl",
    "losses/entropy",
    "losses/value",
    "losses/policy_value",
    "charts/value_mae",
    "charts/clipfrac",
    "charts/clipfrac_lower",
    "charts/approx_kl",
    "charts/value_clipfrac",
    "charts/candidate_clipfrac",
    "charts/candidate_kl",
)
"""Per-mini-batch statistics, in the order of :attr:`MicroLoss.stats`."""


def unit_weight(
    mode: str, rows: Sequence[TrainRow], minibatch_rows: int, minibatch_tokens: int
) -> float:
    """This micro-batch's share of the mini-batch in the unit ``mode`` averages over."""
    if not rows:
        return 0.0
    if mode == "token-mean":
        return sum(r.item.width for r in rows) / minibatch_tokens
    if mode == "seq-mean-token-sum-norm":
        return 1.0
    return len(rows) / minibatch_rows


@dataclass
class MicroLoss:
    loss: torch.Tensor
    """Differentiable scalar of this micro-batch, unweighted (its own ``agg_loss``)."""
    stats: torch.Tensor
    """[len(STAT_NAMES)] detached float64 statistics of this micro-batch."""


def _value_bins_loss(
    outputs: Sequence[RowOutput],
    rows: Sequence[TrainRow],
    value_range: tuple[float, float] | None,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(L_bins, |V - target| mean) over the rows that carry value replies and a target."""
    zero = torch.zeros((), device=device)
    valued = [
        (o.value_bins, r.value_target)
        for o, r in zip(outputs, rows, strict=True)
        if o.value_bins is not None and r.value_target is not None
    ]
    if not valued or value_range is None:
        return zero, zero
    log_p = torch.stack([v for v, _ in valued]).float()
    centres = candidates.bin_centres(value_range[0], value_range[1], log_p.shape[-1])
    targets = torch.tensor(
        np.stack([candidates.two_hot(g, centres) for _, g in valued]),
        dtype=torch.float32,
        device=device,
    )
    goals = torch.tensor([g for _, g in valued], dtype=torch.float32, device=device)
    expected = choice.expected_values(log_p.detach(), torch.tensor(centres, device=device))
    return choice.bin_cross_entropy(log_p, targets).mean(), (expected - goals).abs().mean()


def sft_micro_loss(
    outputs: Sequence[RowOutput],
    rows: Sequence[TrainRow],
    *,
    device: torch.device,
    value_range: tuple[float, float] | None,
    bins_coef: float,
) -> MicroLoss:
    """The supervised warm start's loss of ``rows`` (module docstring)."""
    terms = []
    for out, row in zip(outputs, rows, strict=True):
        if out.candidates is not None:
            weights = torch.tensor(row.target_weights or (), dtype=torch.float32, device=device)
            if weights.shape != out.candidates.shape:
                raise ValueError(
                    f"{weights.numel()} target weights for {out.candidates.numel()} candidates"
                )
            log_pi = torch.where(weights > 0, out.candidates.float(), torch.zeros_like(weights))
            terms.append(-(weights * log_pi).sum())
        else:
            terms.append(-out.logprobs.float().mean())
    loss = torch.stack(terms).mean()
    bins_loss, bins_mae = _value_bins_loss(outputs, rows, value_range, device)
    total = loss + bins_coef * bins_loss if bins_coef > 0 else loss
    zero = torch.zeros((), device=device)
    stats = torch.stack(
        [total.detach(), loss.detach(), zero, zero, zero, bins_loss.detach(), bins_mae]
        + [zero] * (len(STAT_NAMES) - 7)
    ).to(torch.float64)
    return MicroLoss(total, stats)


def micro_loss(
    outputs: Sequence[RowOutput],
    rows: Sequence[TrainRow],
    spec: PolicyLossSpec,
    *,
    width: int,
    device: torch.device,
    value_coef: float | None,
    value_clip: float,
    value_range: tuple[float, float] | None = None,
    bins_coef: float = 0.0,
) -> MicroLoss:
    """The loss of ``rows`` given the fresh forward ``outputs`` (module docstring)."""
    mode = spec.loss_agg_mode
    mask = pad_rows([[1.0] * r.item.width for r in rows], width, device)
    log_prob = pad_rows([o.logprobs for o in outputs], width, device)
    old_log_prob = pad_rows([r.old_logprobs for r in rows], width, device)
    advantages = pad_rows([r.advantages for r in rows], width, device)
    policy = ppo.compute_policy_loss(
        old_log_prob,
        log_prob,
        advantages,
        mask,
        clip_ratio_low=spec.clip_ratio_low,
        clip_ratio_high=spec.clip_ratio_high,
        clip_ratio_c=spec.dual_clip_c,
        loss_agg_mode=mode,
    )
    loss = policy.pg_loss
    zero = torch.zeros((), device=device)
    candidate_clipfrac, candidate_kl = zero, zero
    siblings = [i for i, (o, r) in enumerate(zip(outputs, rows, strict=True)) if _all_action(o, r)]
    if siblings:
        term = _candidate_term(outputs, rows, siblings, spec, device)
        per_row = torch.zeros((len(rows), width), device=device)
        per_row[siblings, 0] = term.losses
        loss = loss + ppo.agg_loss(per_row, mask, mode)
        candidate_clipfrac, candidate_kl = term.clipfrac, term.kl.mean()
    kl_loss = zero
    if spec.kl_coef > 0:
        kl_mat = _kl_matrix(outputs, rows, spec, log_prob, width=width, device=device)
        kl_loss = ppo.agg_loss(kl_mat, mask, mode)
        loss = loss + spec.kl_coef * kl_loss
    entropy = zero
    if all(o.entropy is not None for o in outputs):
        entropy_mat = pad_rows([o.entropy for o in outputs if o.entropy is not None], width, device)
        entropy = ppo.agg_loss(entropy_mat, mask, mode)
        if spec.entropy_coef > 0:
            loss = loss - spec.entropy_coef * entropy
    value_loss, value_clipfrac = zero, zero
    if value_coef is not None:
        vpreds = pad_rows([o.values for o in outputs if o.values is not None], width, device)
        returns = pad_rows([r.returns or () for r in rows], width, device)
        old_values = pad_rows([r.old_values or () for r in rows], width, device)
        value = ppo.compute_value_loss(vpreds, returns, old_values, mask, value_clip, mode)
        value_loss, value_clipfrac = value.vf_loss, value.vf_clipfrac
        loss = loss + value_coef * value_loss
    bins_loss, bins_mae = _value_bins_loss(outputs, rows, value_range, device)
    if bins_coef > 0:
        loss = loss + bins_coef * bins_loss
    stats = torch.stack(
        [
            loss.detach(),
            policy.pg_loss.detach(),
            kl_loss.detach(),
            entropy.detach(),
            value_loss.detach(),
            bins_loss.detach(),
            bins_mae.detach(),
            policy.pg_clipfrac,
            policy.pg_clipfrac_lower,
            policy.ppo_kl,
            value_clipfrac.detach(),
            candidate_clipfrac,
            candidate_kl,
        ]
    ).to(torch.float64)
    return MicroLoss(loss, stats)


def _all_action(output: RowOutput, row: TrainRow) -> bool:
    """Whether ``row`` trains every candidate (sibling step groups)."""
    return bool(row.candidate_advantages) and output.candidates is not None


def _stack_candidates(
    values: Sequence[Sequence[float] | torch.Tensor], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, K] padded values and their mask."""
    widest = max(len(v) for v in values)
    mask = pad_rows([[1.0] * len(v) for v in values], widest, device) > 0
    return pad_rows(values, widest, device), mask


def _candidate_term(
    outputs: Sequence[RowOutput],
    rows: Sequence[TrainRow],
    index: Sequence[int],
    spec: PolicyLossSpec,
    device: torch.device,
) -> ppo.CandidateLoss:
    """The all-action surrogate of the rows at ``index`` (module docstring)."""
    new, mask = _stack_candidates([outputs[i].candidates for i in index], device)  # type: ignore[misc]
    old, _ = _stack_candidates([rows[i].candidate_old_logprobs or () for i in index], device)
    advantages, _ = _stack_candidates([rows[i].candidate_advantages or () for i in index], device)
    return ppo.compute_candidate_policy_loss(
        old,
        new,
        advantages,
        mask,
        clip_ratio_low=spec.clip_ratio_low,
        clip_ratio_high=spec.clip_ratio_high,
        clip_ratio_c=spec.dual_clip_c,
    )


def _kl_matrix(
    outputs: Sequence[RowOutput],
    rows: Sequence[TrainRow],
    spec: PolicyLossSpec,
    log_prob: torch.Tensor,
    *,
    width: int,
    device: torch.device,
) -> torch.Tensor:
    """[rows, width] KL to the reference: the estimator on the sampled tokens, or with
    ``exact`` the whole KL over a choice row's candidates (low_var_kl on text rows)."""
    ref_log_prob = pad_rows([r.ref_logprobs or () for r in rows], width, device)
    estimator = "low_var_kl" if spec.kl_estimator == "exact" else spec.kl_estimator
    kl_mat = kl.kl_penalty(log_prob, ref_log_prob, estimator)
    if spec.kl_estimator != "exact":
        return kl_mat
    exact = [
        i
        for i, (o, r) in enumerate(zip(outputs, rows, strict=True))
        if o.candidates is not None and r.ref_candidates
    ]
    if not exact:
        return kl_mat
    new, mask = _stack_candidates([outputs[i].candidates for i in exact], device)  # type: ignore[misc]
    ref, _ = _stack_candidates([rows[i].ref_candidates or () for i in exact], device)
    kl_mat = kl_mat.clone()
    kl_mat[exact, 0] = choice.categorical_kl(new, ref, mask)
    return kl_mat
