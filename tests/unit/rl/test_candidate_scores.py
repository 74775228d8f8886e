"""Length-normalised choice scores and value bins: numpy and torch against slow loops."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from aflowrl.rl import candidates, choice
from aflowrl.rl.errors import RLInputError


def _random_candidates(rng: random.Random, count: int) -> list[list[float]]:
    return [[-rng.random() * 4 for _ in range(rng.randint(1, 7))] for _ in range(count)]


def _loop_log_pi(cands: list[list[float]], normalised: bool) -> list[float]:
    scores = [sum(c) / (len(c) if normalised else 1) for c in cands]
    top = max(scores)
    log_z = top + math.log(sum(math.exp(s - top) for s in scores))
    return [s - log_z for s in scores]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("normalised", [False, True])
def test_numpy_choice_log_probs_match_the_loop(seed, normalised):
    rng = random.Random(seed)
    cands = _random_candidates(rng, rng.randint(1, 9))
    got = candidates.choice_log_probs(cands, length_normalised=normalised)
    assert np.allclose(got, _loop_log_pi(cands, normalised), atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("normalised", [False, True])
def test_torch_and_numpy_agree_and_gradients_flow(seed, normalised):
    rng = random.Random(seed)
    steps = [_random_candidates(rng, k) for k in (3, 1, 6)]
    tensors = [
        [torch.tensor(c, dtype=torch.float64, requires_grad=True) for c in step] for step in steps
    ]
    padded = choice.pad_candidates(tensors)
    chosen = torch.tensor([rng.randrange(len(s)) for s in steps])
    out = choice.choice_log_probs(
        padded.token_log_probs,
        padded.token_mask,
        chosen,
        padded.candidate_mask,
        length_normalised=normalised,
    )
    for i, step in enumerate(steps):
        want = candidates.choice_log_probs(step, length_normalised=normalised)
        assert np.allclose(out.log_probs[i, : len(step)].detach().numpy(), want, atol=1e-10)
    out.log_prob.sum().backward()
    # d log pi_c / d token t of candidate k = (1[k=c] - pi_k) / n_k (normalised) or (... ) / 1.
    for i, step in enumerate(steps):
        pi = np.exp(candidates.choice_log_probs(step, length_normalised=normalised))
        for k, tensor in enumerate(tensors[i]):
            scale = len(step[k]) if normalised else 1
            want = ((1.0 if k == int(chosen[i]) else 0.0) - pi[k]) / scale
            assert tensor.grad is not None
            assert np.allclose(tensor.grad.numpy(), want, atol=1e-10)


def test_length_normalisation_removes_the_length_penalty():
    short, long = [-2.0], [-2.0] * 10
    summed = candidates.choice_log_probs([short, long], length_normalised=False)
    assert summed[0] > summed[1] + 10
    normalised = candidates.choice_log_probs([short, long], length_normalised=True)
    assert normalised[0] == pytest.approx(normalised[1])


def test_bin_centres_are_evenly_spaced_over_the_range():
    assert candidates.bin_centres(-0.2, 0.4, 4).tolist() == pytest.approx([-0.2, 0.0, 0.2, 0.4])
    with pytest.raises(RLInputError):
        candidates.bin_centres(0.3, 0.3, 10)
    with pytest.raises(RLInputError):
        candidates.bin_centres(0.0, 1.0, 1)


@pytest.mark.parametrize("target", [-1.0, -0.2, -0.13, 0.0, 0.05, 0.2, 0.399, 0.4, 3.0])
def test_two_hot_has_the_clipped_target_as_its_mean(target):
    centres = candidates.bin_centres(-0.2, 0.4, 7)
    weights = candidates.two_hot(target, centres)
    assert weights.sum() == pytest.approx(1.0)
    assert (weights >= 0).all() and np.count_nonzero(weights) <= 2
    clipped = min(max(target, -0.2), 0.4)
    assert float(weights @ centres) == pytest.approx(clipped, abs=1e-12)
    nonzero = np.flatnonzero(weights)
    assert len(nonzero) == 1 or nonzero[1] == nonzero[0] + 1


def test_expected_value_matches_the_loop_and_torch():
    rng = random.Random(3)
    centres = candidates.bin_centres(-0.25, 0.5, 10)
    for _ in range(5):
        ll = [-rng.random() * 6 for _ in range(10)]
        z = sum(math.exp(v) for v in ll)
        want = sum(math.exp(v) / z * c for v, c in zip(ll, centres, strict=True))
        assert candidates.expected_value(ll, centres) == pytest.approx(want, abs=1e-12)
        log_p = torch.log_softmax(torch.tensor([ll], dtype=torch.float64), dim=-1)
        got = choice.expected_values(log_p, torch.tensor(centres))
        assert float(got[0]) == pytest.approx(want, abs=1e-12)


def test_bin_cross_entropy_is_minimised_by_the_two_hot_target():
    centres = candidates.bin_centres(-0.2, 0.4, 7)
    weights = torch.tensor(np.stack([candidates.two_hot(t, centres) for t in (0.05, -0.2)]))
    logits = torch.zeros(2, 7, dtype=torch.float64, requires_grad=True)
    optimiser = torch.optim.SGD([logits], lr=2.0)
    for _ in range(400):
        optimiser.zero_grad()
        loss = choice.bin_cross_entropy(torch.log_softmax(logits, dim=-1), weights).sum()
        loss.backward()
        optimiser.step()
    p = torch.softmax(logits, dim=-1).detach()
    assert torch.allclose(p, weights, atol=1e-2)
    values = choice.expected_values(torch.log(p), torch.tensor(centres))
    assert values.tolist() == pytest.approx([0.05, -0.2], abs=5e-3)
    # Loop oracle of the loss itself.
    log_p = torch.log_softmax(torch.randn(2, 7, dtype=torch.float64), dim=-1)
    got = choice.bin_cross_entropy(log_p, weights)
    for i in range(2):
        want = -sum(float(weights[i, b]) * float(log_p[i, b]) for b in range(7))
        assert float(got[i]) == pytest.approx(want, abs=1e-12)


def test_bad_scores_are_refused_with_the_field():
    with pytest.raises(RLInputError, match="candidates"):
        candidates.choice_log_probs([], length_normalised=True)
    with pytest.raises(RLInputError, match="no tokens"):
        candidates.choice_log_probs([[-1.0], []], length_normalised=True)
    with pytest.raises(RLInputError, match="finite"):
        candidates.choice_log_probs([[-1.0], [float("nan")]], length_normalised=False)
    with pytest.raises(RLInputError, match="bins"):
        candidates.expected_value([0.0, 0.0], [0.0, 1.0, 2.0])
