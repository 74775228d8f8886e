"""Responses sharing one pass over their prompt score what separate prompt + response rows do.

Oracle: :func:`pack_sequences` of every (prompt, response) pair, one plain causal row each, on
the tiny Qwen2 model. Checked on random prompts of different lengths, rows mixing a single
response (text mode) with several (choice mode), padding, and the gradients of a loss on the
log-probabilities.
"""

from __future__ import annotations

import random

import pytest
import torch

from aflowrl.models import builtin, loading
from aflowrl.models.logprobs import (
    pack_prompt_branches,
    pack_sequences,
    selected_hidden_states,
    tempered_logprobs,
)


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    return loading.load_causal_lm(
        builtin.ensure("tiny"), dtype=torch.float32, device=torch.device("cpu")
    )


def _logprobs(lm, packed) -> torch.Tensor:
    logits = lm.get_output_embeddings()(selected_hidden_states(lm, packed))
    return tempered_logprobs(logits, packed.targets, 0.7)


def _batch(seed: int) -> tuple[list[list[int]], list[list[list[int]]]]:
    rng = random.Random(seed)
    prompts, branches = [], []
    for row in range(4):
        prompts.append([rng.randrange(3, 500) for _ in range(rng.randint(1, 40))])
        count = 1 if row == 1 else rng.randint(2, 9)  # row 1: a text-mode sequence
        branches.append(
            [[rng.randrange(3, 500) for _ in range(rng.randint(1, 6))] for _ in range(count)]
        )
    return prompts, branches


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shared_prompts_give_the_separate_rows_log_probs(lm, seed):
    prompts, branches = _batch(seed)
    pairs = [(p, r) for p, b in zip(prompts, branches, strict=True) for r in b]
    separate = pack_sequences([p for p, _ in pairs], [r for _, r in pairs], pad_id=0)
    shared = pack_prompt_branches(prompts, branches, pad_id=0)
    assert shared.attention_mask.dim() == 4
    assert shared.response_lengths == separate.response_lengths
    assert torch.equal(shared.targets, separate.targets)
    assert shared.input_ids.numel() < separate.input_ids.numel()
    with torch.no_grad():
        expected, got = _logprobs(lm, separate), _logprobs(lm, shared)
    assert (got - expected).abs().max().item() < 1e-5


def test_gradients_match_too(lm):
    prompts, branches = _batch(3)
    pairs = [(p, r) for p, b in zip(prompts, branches, strict=True) for r in b]
    weights = torch.linspace(-1.0, 1.0, sum(len(r) for _, r in pairs))

    def grads(packed) -> list[torch.Tensor]:
        lm.zero_grad()
        (weights * _logprobs(lm, packed)).sum().backward()
        return [p.grad.clone() for p in lm.parameters() if p.grad is not None]

    expected = grads(pack_sequences([p for p, _ in pairs], [r for _, r in pairs], pad_id=0))
    got = grads(pack_prompt_branches(prompts, branches, pad_id=0))
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert torch.isfinite(g).all()
        assert (g - e).abs().max().item() < 1e-4 * max(1.0, e.abs().max().item())


def test_single_responses_are_plain_rows_and_bad_rows_are_named():
    plain = pack_prompt_branches([[1, 2], [3]], [[[4]], [[5, 6]]], pad_id=0)
    assert plain.attention_mask.dim() == 2  # no 4-D mask without shared prompts
    with pytest.raises(ValueError, match="row 0: empty prompt"):
        pack_prompt_branches([[]], [[[1], [2]]], pad_id=0)
    with pytest.raises(ValueError, match="row 0: response 1 is empty"):
        pack_prompt_branches([[1]], [[[1], []]], pad_id=0)
