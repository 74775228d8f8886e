"""Choice-mode policy: log pi(a | s) over an enumerable set of admissible actions.

A small policy acts by scoring every admissible action rather than by free generation (Carta et
al., 2023, "Grounding Large Language Models in Interactive Environments with Online
Reinforcement Learning", arXiv 2302.02662). The score of candidate k is the log-likelihood of
its token sequence under the policy, and the action distribution is their softmax:

    ll_k     = sum_t m_{k,t} log p(w_{k,t} | s, w_{k,<t})
    log pi_k = ll_k - logsumexp_{j admissible} ll_j
    H        = -sum_{k admissible} pi_k log pi_k

Everything is differentiable (torch autograd). The learner computes per-token log-probs of each
candidate's tokens (teacher-forced after the prompt), pads them into [steps, candidates, tokens]
(or calls :func:`pad_candidates` on lists), then :func:`choice_log_probs`. For the PPO loss, use
``log_prob[:, None]`` as a one-token response with mask ``ones(steps, 1)``.

With ``length_normalised`` the score of a candidate is its *mean* token log-probability,
ll_k / n_k, so a long action is not penalised for its length; the action candidates of the
policy's replies are scored that way (:mod:`aflowrl.search.encoding`). The policy's value bins
(``<value>0`` ... ``<value>9`` after the same prompt) are scored summed, and trained by
:func:`bin_cross_entropy` against two-hot targets. The numpy side of the same formulas (what the
torch-free trainer computes from the rollout's scores) is :mod:`aflowrl.rl.candidates`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from aflowrl.rl.errors import RLInputError

__all__ = [
    "ChoiceLogProbs",
    "PaddedCandidates",
    "bin_cross_entropy",
    "candidate_log_probs",
    "categorical_kl",
    "choice_log_probs",
    "expected_values",
    "pad_candidates",
    "total_variation",
]


class PaddedCandidates(NamedTuple):
    """Candidates' token log-probs padded to [steps, candidates, tokens]."""

    token_log_probs: torch.Tensor
    """[steps, K, T] float: log p of each candidate token; 0 on padding."""
    token_mask: torch.Tensor
    """[steps, K, T] bool: True on a candidate's real tokens."""
    candidate_mask: torch.Tensor
    """[steps, K] bool: True where candidate k exists for that step."""


class ChoiceLogProbs(NamedTuple):
    """The chosen action's log-probability and the entropy of the choice, per step."""

    log_prob: torch.Tensor
    """[steps]: log pi(chosen | s)."""
    entropy: torch.Tensor
    """[steps]: entropy of pi(. | s) over the admissible candidates (nats)."""
    log_probs: torch.Tensor
    """[steps, K]: log pi(k | s) for every candidate; -inf for padded candidates."""


def candidate_log_probs(
    token_log_probs: torch.Tensor,
    token_mask: torch.Tensor,
    candidate_mask: torch.Tensor | None = None,
    *,
    length_normalised: bool = False,
) -> torch.Tensor:
    """log pi(k | s) = score_k - logsumexp_j score_j over admissible candidates, [..., K].

    score_k is ll_k, or ll_k / n_k with ``length_normalised`` (module docstring).

    ``token_log_probs`` and ``token_mask`` are [..., K, T]; ``candidate_mask`` [..., K] marks
    the candidates that exist (default: all). Padded tokens are ignored whatever they hold
    (even -inf or NaN); a padded candidate gets -inf. Every step needs one candidate at least.
    """
    if token_log_probs.shape != token_mask.shape or token_log_probs.dim() < 2:
        raise RLInputError(
            f"expected token_log_probs and token_mask of one shape [..., K, T], got "
            f"{list(token_log_probs.shape)} and {list(token_mask.shape)}",
            field="token_mask",
        )
    if candidate_mask is None:
        candidate_mask = torch.ones(
            token_log_probs.shape[:-1], dtype=torch.bool, device=token_log_probs.device
        )
    candidate_mask = candidate_mask.bool()
    if candidate_mask.shape != token_log_probs.shape[:-1]:
        raise RLInputError(
            f"expected shape {list(token_log_probs.shape[:-1])}, got {list(candidate_mask.shape)}",
            field="candidate_mask",
        )
    if not bool(candidate_mask.any(dim=-1).all()):
        raise RLInputError(
            "every step needs at least one admissible candidate", field="candidate_mask"
        )
    token_mask = token_mask.bool()
    token_terms = torch.where(token_mask, token_log_probs, torch.zeros_like(token_log_probs))
    sequence_log_likelihood = token_terms.sum(dim=-1)
    if length_normalised:
        lengths = token_mask.sum(dim=-1).clamp(min=1).to(sequence_log_likelihood.dtype)
        sequence_log_likelihood = sequence_log_likelihood / lengths
    scores = sequence_log_likelihood.masked_fill(~candidate_mask, float("-inf"))
    return torch.log_softmax(scores, dim=-1)


def choice_log_probs(
    token_log_probs: torch.Tensor,
    token_mask: torch.Tensor,
    chosen: torch.Tensor,
    candidate_mask: torch.Tensor | None = None,
    *,
    length_normalised: bool = False,
) -> ChoiceLogProbs:
    """log pi(chosen | s), the entropy over candidates, and every log pi(k | s).

    Shapes: token_log_probs and token_mask [steps, K, T], chosen [steps] (int64 candidate
    indices), candidate_mask [steps, K] or None. The chosen candidate must be admissible.
    """
    log_probs = candidate_log_probs(
        token_log_probs, token_mask, candidate_mask, length_normalised=length_normalised
    )
    if log_probs.dim() != 2 or chosen.shape != log_probs.shape[:1]:
        raise RLInputError(
            f"expected chosen of shape {list(log_probs.shape[:1])} for log-probs "
            f"{list(log_probs.shape)}, got {list(chosen.shape)}",
            field="chosen",
        )
    chosen = chosen.long()
    if bool(((chosen < 0) | (chosen >= log_probs.shape[-1])).any()):
        raise RLInputError(f"indices must be in [0, {log_probs.shape[-1]})", field="chosen")
    log_prob = log_probs.gather(-1, chosen[:, None]).squeeze(-1)
    if bool(torch.isneginf(log_prob).any()):
        raise RLInputError("a chosen candidate is not admissible (candidate_mask)", field="chosen")
    admissible = torch.isfinite(log_probs)
    finite_log_probs = torch.where(admissible, log_probs, torch.zeros_like(log_probs))
    entropy = -torch.sum(finite_log_probs.exp() * finite_log_probs, dim=-1)
    return ChoiceLogProbs(log_prob, entropy, log_probs)


def pad_candidates(candidates: Sequence[Sequence[torch.Tensor]]) -> PaddedCandidates:
    """Pad per-step lists of per-candidate 1-D token log-prob tensors (differentiable).

    ``candidates[i][k]`` is candidate k's token log-probs at step i; steps may have different
    numbers of candidates and candidates different lengths.
    """
    flat = [sequence for step in candidates for sequence in step]
    if not flat:
        raise RLInputError("no candidates", field="candidates")
    if any(sequence.dim() != 1 for sequence in flat):
        raise RLInputError(
            "each candidate must be a 1-D tensor of token log-probs", field="candidates"
        )
    steps = len(candidates)
    max_candidates = max(len(step) for step in candidates)
    max_tokens = max(len(sequence) for sequence in flat)
    device = flat[0].device
    slots = torch.tensor(
        [i * max_candidates + k for i, step in enumerate(candidates) for k in range(len(step))],
        dtype=torch.long,
        device=device,
    )
    lengths = torch.tensor([len(sequence) for sequence in flat], dtype=torch.long, device=device)
    padded = torch.nn.utils.rnn.pad_sequence(flat, batch_first=True, padding_value=0.0)
    token_log_probs = padded.new_zeros(steps * max_candidates, max_tokens).index_copy(
        0, slots, padded
    )
    flat_mask = torch.arange(max_tokens, device=device)[None, :] < lengths[:, None]
    token_mask = torch.zeros(steps * max_candidates, max_tokens, dtype=torch.bool, device=device)
    token_mask[slots] = flat_mask
    candidate_mask = torch.zeros(steps * max_candidates, dtype=torch.bool, device=device)
    candidate_mask[slots] = True
    return PaddedCandidates(
        token_log_probs.view(steps, max_candidates, max_tokens),
        token_mask.view(steps, max_candidates, max_tokens),
        candidate_mask.view(steps, max_candidates),
    )


def expected_values(bin_log_probs: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """V = sum_b p_b c_b per row: ``bin_log_probs`` [rows, B] (log-softmax over the bins)."""
    if bin_log_probs.dim() != 2 or centres.shape != bin_log_probs.shape[-1:]:
        raise RLInputError(
            f"expected bin log-probs [rows, {centres.shape[0]}], got {list(bin_log_probs.shape)}",
            field="bins",
        )
    return (bin_log_probs.exp() * centres.to(bin_log_probs.dtype)).sum(dim=-1)


def bin_cross_entropy(bin_log_probs: torch.Tensor, target_weights: torch.Tensor) -> torch.Tensor:
    """L = -sum_b w_b log p_b per row (w: the two-hot target, :func:`rl.candidates.two_hot`)."""
    if bin_log_probs.shape != target_weights.shape or bin_log_probs.dim() != 2:
        raise RLInputError(
            f"expected bin log-probs and targets of one shape [rows, B], got "
            f"{list(bin_log_probs.shape)} and {list(target_weights.shape)}",
            field="value_targets",
        )
    return -(target_weights.to(bin_log_probs.dtype) * bin_log_probs).sum(dim=-1)


def _masked(
    log_p: torch.Tensor, log_q: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(keep, log_p, log_q) with the padded entries of both set to 0 (finite), shapes checked."""
    if log_p.shape != log_q.shape:
        raise RLInputError(
            f"expected log_p and log_q of one shape, got {list(log_p.shape)} and "
            f"{list(log_q.shape)}",
            field="log_q",
        )
    keep = torch.ones_like(log_p, dtype=torch.bool) if mask is None else mask.bool()
    zero = torch.zeros_like(log_p)
    return keep, torch.where(keep, log_p, zero), torch.where(keep, log_q, zero)


def categorical_kl(
    log_p: torch.Tensor, log_q: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """KL(p || q) = sum_k p_k (log p_k - log q_k) over the last axis, [...] (exact, no sampling).

    ``mask`` marks the candidates that exist (default: all); padded entries may hold anything
    (-inf included). Differentiable in both arguments.
    """
    keep, lp, lq = _masked(log_p, log_q, mask)
    return torch.where(keep, lp.exp() * (lp - lq), torch.zeros_like(lp)).sum(dim=-1)


def total_variation(
    log_p: torch.Tensor, log_q: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """TV(p, q) = 1/2 sum_k |p_k - q_k| over the last axis, [...] (``mask`` as above)."""
    keep, lp, lq = _masked(log_p, log_q, mask)
    return 0.5 * torch.where(keep, lp.exp() - lq.exp(), torch.zeros_like(lp)).abs().sum(dim=-1)
