"""The all-action surrogate of choice rows, the exact KL / TV over candidates, and the sibling
step groups' advantages, against slow loops; and what their gradient is."""

from __future__ import annotations

import math

import numpy as np
import pytest
import rl_oracles as oracle
import torch

from aflowrl.rl import choice, gigpo, ppo
from aflowrl.rl.errors import RLInputError


def _candidates(seed: int, rows: int = 4, width: int = 6):
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(2, width + 1, (rows,), generator=gen)
    mask = torch.arange(width)[None, :] < counts[:, None]
    scores = torch.randn(rows, width, generator=gen, dtype=torch.float64)
    old = torch.log_softmax(scores.masked_fill(~mask, -math.inf), dim=-1)
    new_scores = scores + torch.randn(rows, width, generator=gen, dtype=torch.float64) * 0.5
    new = torch.log_softmax(new_scores.masked_fill(~mask, -math.inf), dim=-1)
    adv = torch.randn(rows, width, generator=gen, dtype=torch.float64)
    return old, new, adv, mask


@pytest.mark.parametrize("seed", range(5))
def test_candidate_loss_matches_the_loop(seed):
    old, new, adv, mask = _candidates(seed)
    got = ppo.compute_candidate_policy_loss(
        old, new, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28
    )
    losses, clipfrac, kls = oracle.candidate_policy_loss(
        old.numpy(), new.numpy(), adv.numpy(), mask.numpy(), low=0.2, high=0.28, c=3.0
    )
    np.testing.assert_allclose(got.losses.numpy(), losses, rtol=1e-12, atol=1e-12)
    assert float(got.clipfrac) == pytest.approx(clipfrac, abs=1e-12)
    np.testing.assert_allclose(got.kl.numpy(), kls, rtol=1e-10, atol=1e-12)


def test_without_clipping_its_gradient_is_the_exact_policy_gradient():
    """At pi = pi_old: grad sum_k pi_old(k) (-r_k A_k) = -sum_k pi(k) A_k grad log pi(k)."""
    scores = torch.tensor([[0.3, -0.2, 1.1, 0.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[0.5, -1.0, 2.0, 0.1]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    log_pi = torch.log_softmax(scores, dim=-1)
    loss = ppo.compute_candidate_policy_loss(
        log_pi.detach(), log_pi, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2
    ).losses.sum()
    (grad,) = torch.autograd.grad(loss, scores, retain_graph=True)
    objective = (log_pi.exp() * adv).sum()  # the expected advantage under pi
    (want,) = torch.autograd.grad(objective, scores)
    torch.testing.assert_close(grad, -want)


def test_padded_candidates_do_not_count_whatever_they_hold():
    old, new, adv, mask = _candidates(7)
    poisoned_old, poisoned_new, poisoned_adv = old.clone(), new.clone(), adv.clone()
    poisoned_old[~mask] = float("nan")
    poisoned_new[~mask] = float("-inf")
    poisoned_adv[~mask] = 1e9
    a = ppo.compute_candidate_policy_loss(
        old, new, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2
    )
    b = ppo.compute_candidate_policy_loss(
        poisoned_old, poisoned_new, poisoned_adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2
    )
    torch.testing.assert_close(a.losses, b.losses)


def test_shapes_must_agree():
    old, new, adv, mask = _candidates(1)
    with pytest.raises(RLInputError):
        ppo.compute_candidate_policy_loss(
            old, new[:, :-1], adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2
        )


@pytest.mark.parametrize("seed", range(4))
def test_exact_kl_and_tv_match_their_definitions(seed):
    old, new, _, mask = _candidates(seed)
    kl = choice.categorical_kl(old, new, mask)
    tv = choice.total_variation(old, new, mask)
    for i in range(old.shape[0]):
        p = old[i][mask[i]].exp().numpy()
        q = new[i][mask[i]].exp().numpy()
        assert float(kl[i]) == pytest.approx(float((p * np.log(p / q)).sum()), abs=1e-12)
        assert float(tv[i]) == pytest.approx(0.5 * float(np.abs(p - q).sum()), abs=1e-12)
    assert torch.all(choice.categorical_kl(old, old, mask).abs() < 1e-12)


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
def test_sibling_step_advantages_match_the_loop(mode):
    rng = np.random.default_rng(3)
    rewards = [list(rng.normal(size=rng.integers(1, 9))) for _ in range(6)] + [[0.2, 0.2, 0.2]]
    got = gigpo.compute_sibling_step_advantages(rewards, mode=mode)
    want = oracle.sibling_step_advantages(rewards, by_std=mode == "mean_std_norm")
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12)


def test_sibling_step_advantages_refuse_non_finite_rewards():
    with pytest.raises(RLInputError):
        gigpo.compute_sibling_step_advantages([[0.1, math.nan]])
