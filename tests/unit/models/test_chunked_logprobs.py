"""Chunked log-probabilities over the vocabulary: the same values and gradients as the whole
logits, and no tokens x vocabulary tensor kept for the backward pass."""

from __future__ import annotations

import pytest
import torch

from aflowrl.models.logprobs import chunked_token_stats, tempered_logprobs
from aflowrl.rl.ppo import entropy_from_logits


def _case(n: int = 11, hidden: int = 8, vocab: int = 50, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(hidden, vocab, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, hidden, generator=generator))
    h = torch.randn(n, hidden, generator=generator, requires_grad=True)
    tokens = torch.randint(0, vocab, (n,), generator=generator)
    return head, h, tokens


def _whole(head, h, tokens, temperature):
    logits = head(h)
    logp = tempered_logprobs(logits, tokens, temperature)
    ent = entropy_from_logits(logits.float() / (temperature if temperature > 0 else 1.0))
    return logp, ent


@pytest.mark.parametrize("chunk", [1, 3, 11, 64])
@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_chunks_give_the_whole_logits_values_and_gradients(chunk, temperature):
    head, h, tokens = _case()
    expected_logp, expected_ent = _whole(head, h, tokens, temperature)
    weights = torch.linspace(-1.0, 1.0, h.shape[0])
    (expected_logp * weights).sum().backward(retain_graph=True)
    (expected_ent * weights).sum().backward()
    expected_grad_h, expected_grad_w = h.grad.clone(), head.weight.grad.clone()
    h.grad, head.weight.grad = None, None

    logp, ent = chunked_token_stats(
        head, h, tokens, temperature, chunk_tokens=chunk, entropy=True, entropy_grad=True
    )
    assert torch.allclose(logp, expected_logp, atol=1e-6)
    assert ent is not None and torch.allclose(ent, expected_ent, atol=1e-5)
    ((logp * weights).sum() + (ent * weights).sum()).backward()
    assert torch.allclose(h.grad, expected_grad_h, atol=1e-5)
    assert torch.allclose(head.weight.grad, expected_grad_w, atol=1e-5)


def test_entropy_without_grad_adds_nothing_to_the_gradient():
    head, h, tokens = _case()
    logp, ent = chunked_token_stats(head, h, tokens, 1.0, chunk_tokens=4, entropy=True)
    assert ent is not None and not ent.requires_grad
    logp.sum().backward()
    only_logp = h.grad.clone()
    h.grad = None
    tempered_logprobs(head(h), tokens, 1.0).sum().backward()
    assert torch.allclose(only_logp, h.grad, atol=1e-6)


def test_the_backward_pass_keeps_no_full_logits():
    """Saved tensors of the graph: with chunks of 4 no [N, V] (or [chunk, V]) tensor is kept."""
    head, h, tokens = _case(n=32, vocab=997)
    saved: list[tuple[int, ...]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, _ = chunked_token_stats(head, h, tokens, 1.0, chunk_tokens=4)
    assert logp.shape == (32,)
    assert not any(997 in shape for shape in saved), saved
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        tempered_logprobs(head(h), tokens, 1.0)
    assert any(997 in shape for shape in saved)  # the unchunked path keeps [N, V]


def test_no_tokens_gives_empty_results():
    head, h, tokens = _case(n=0)
    logp, ent = chunked_token_stats(head, h, tokens, 1.0, chunk_tokens=4, entropy=True)
    assert logp.shape == (0,) and ent is not None and ent.shape == (0,)
