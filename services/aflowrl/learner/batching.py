"""Training rows, their deterministic split over ranks, and the forward pass over them.

Rows are plain dataclasses (rank 0 builds them from the request and broadcasts them). Every rank
sees the whole batch and takes ``rows[rank::world]`` of each mini-batch, so the split depends only
on the batch and the world size, never on timing. Every rank runs the same number of forward
passes (a rank with nothing left runs a zero-weight dummy row), as FSDP's collectives require.

:func:`forward_rows` scores text sequences (one sequence each) and choice decisions (one
branch per candidate after one copy of the prompt; log pi(chosen) = log-softmax over candidates
of their summed, or length-normalised, token log-probs, :mod:`aflowrl.rl.choice`) in one packed
forward pass. An item's value replies (``<value>0`` ... ``<value>9``,
:mod:`aflowrl.search.encoding`) are more branches after the same prompt; their log-softmax over
the bins is the policy's value distribution, trained towards the step's return.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from aflowrl.learner.policy import PolicyModule
from aflowrl.models import logprobs
from aflowrl.rl import choice

T = TypeVar("T")


@dataclass(frozen=True)
class SequenceItem:
    """A prompt and the response the policy generated (the trained tokens)."""

    prompt: tuple[int, ...]
    response: tuple[int, ...]
    value_bins: tuple[tuple[int, ...], ...] = ()
    """Token ids of the value replies after the prompt (empty: no value)."""

    @property
    def width(self) -> int:
        """Values per row: one per response token."""
        return len(self.response)


@dataclass(frozen=True)
class ChoiceItem:
    """A choice among candidate continuations of a prompt."""

    prompt: tuple[int, ...]
    candidates: tuple[tuple[int, ...], ...]
    chosen: int
    length_normalised: bool = False
    """Score candidates by their mean token log-probability (not the sum)."""
    value_bins: tuple[tuple[int, ...], ...] = ()
    """Token ids of the value replies after the prompt (empty: no value)."""

    @property
    def width(self) -> int:
        """Values per row: one (log pi(chosen))."""
        return 1


Item = SequenceItem | ChoiceItem


@dataclass(frozen=True)
class TrainRow:
    """One training row (``TrainSample``): the item and its per-value targets."""

    item: Item
    old_logprobs: tuple[float, ...]
    advantages: tuple[float, ...]
    ref_logprobs: tuple[float, ...] | None = None
    returns: tuple[float, ...] | None = None
    old_values: tuple[float, ...] | None = None
    value_target: float | None = None
    """The step's discounted return, the target of the item's value replies."""
    target_weights: tuple[float, ...] | None = None
    """Supervised warm start, choice rows: the target distribution over the candidates."""
    candidate_old_logprobs: tuple[float, ...] | None = None
    """Choice rows: log pi_old of every candidate (None: only the chosen one's is known)."""
    candidate_advantages: tuple[float, ...] | None = None
    """Choice rows, GiGPO's sibling step groups: an advantage for every candidate, trained in
    expectation under pi_old (:func:`aflowrl.rl.ppo.compute_candidate_policy_loss`)."""
    ref_candidates: tuple[float, ...] | None = None
    """Choice rows: log pi_ref of every candidate (filled in by the learner for the exact KL)."""


@dataclass
class RowOutput:
    """Forward results of one row (differentiable when computed with grad)."""

    logprobs: torch.Tensor
    """[width] log pi_T of the response tokens, or [1] log pi(chosen)."""
    entropy: torch.Tensor | None
    """[width] token entropies of pi_T, or [1] the entropy over candidates."""
    values: torch.Tensor | None
    """[width] critic values (critic only)."""
    value_bins: torch.Tensor | None = None
    """[bins] log-softmax over the item's value replies (None: the item has none)."""
    candidates: torch.Tensor | None = None
    """Choice rows: [K] log pi of every candidate (the supervised warm start's target is a
    distribution over them)."""


DUMMY = SequenceItem(prompt=(0,), response=(0,))
"""The row a rank with nothing left scores with zero weight (keeps collectives in step)."""


def rank_share(rows: Sequence[T], rank: int, world: int) -> list[T]:
    """This rank's rows: ``rows[rank::world]``."""
    return list(rows[rank::world])


def micro_steps(total: int, world: int, micro: int) -> int:
    """Forward passes every rank makes for ``total`` rows split over ``world`` ranks."""
    return max(1, math.ceil(math.ceil(total / world) / micro))


def forward_rows(
    module: PolicyModule,
    items: Sequence[Item],
    *,
    pad_id: int,
    temperature: float,
    device: torch.device,
    entropy: bool,
    values: bool,
    entropy_grad: bool = False,
) -> list[RowOutput]:
    """Log-probs (and entropies, values) of ``items`` under ``module`` in one forward pass."""
    # A choice's candidates (and any item's value replies) share one pass over its prompt
    # (logprobs.pack_prompt_branches).
    prompts = [item.prompt for item in items]
    branches = [
        ((item.response,) if isinstance(item, SequenceItem) else item.candidates) + item.value_bins
        for item in items
    ]
    packed = logprobs.pack_prompt_branches(prompts, branches, pad_id=pad_id, device=device)
    logp_flat, entropy_flat, value_flat = module(
        packed, temperature, entropy=entropy, entropy_grad=entropy_grad
    )
    token_logp = packed.split(logp_flat)
    token_entropy = packed.split(entropy_flat) if entropy_flat is not None else None
    token_values = packed.split(value_flat.float()) if values and value_flat is not None else None
    outputs: list[RowOutput] = []
    cursor = 0
    for item in items:
        count = 1 if isinstance(item, SequenceItem) else len(item.candidates)
        bins = _bin_log_probs(token_logp[cursor + count : cursor + count + len(item.value_bins)])
        if isinstance(item, SequenceItem):
            outputs.append(
                RowOutput(
                    token_logp[cursor],
                    token_entropy[cursor] if token_entropy is not None else None,
                    token_values[cursor] if token_values is not None else None,
                    bins,
                )
            )
        else:
            padded = choice.pad_candidates([token_logp[cursor : cursor + count]])
            result = choice.choice_log_probs(
                padded.token_log_probs,
                padded.token_mask,
                torch.tensor([item.chosen], device=device),
                padded.candidate_mask,
                length_normalised=item.length_normalised,
            )
            state_value = token_values[cursor][:1] if token_values is not None else None
            outputs.append(
                RowOutput(
                    result.log_prob,
                    result.entropy if entropy else None,
                    state_value,
                    bins,
                    result.log_probs[0],
                )
            )
        cursor += count + len(item.value_bins)
    return outputs


def _bin_log_probs(bin_token_logp: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """log-softmax over the value replies of their summed token log-probs ([bins])."""
    if not bin_token_logp:
        return None
    padded = choice.pad_candidates([list(bin_token_logp)])
    return choice.candidate_log_probs(
        padded.token_log_probs, padded.token_mask, padded.candidate_mask
    )[0]


def pad_rows(
    values: Sequence[Sequence[float] | torch.Tensor], width: int, device: torch.device
) -> torch.Tensor:
    """[rows, width] float32, each row left-aligned and zero-padded (differentiable for tensors)."""
    out = []
    for row in values:
        tensor = row if isinstance(row, torch.Tensor) else torch.tensor(row, dtype=torch.float32)
        tensor = tensor.to(device=device, dtype=torch.float32)
        out.append(torch.nn.functional.pad(tensor, (0, width - tensor.shape[0])))
    return torch.stack(out)
