"""Advantages of step rows: GiGPO, GRPO / RLOO and PPO-GAE, against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aflowrl.config.learner import GiGPOSpec, GRPOSpec, PPOSpec
from aflowrl.errors import InvalidInputError
from aflowrl.trainer.advantages import compute_advantages
from aflowrl.trainer.rows import Decision, StepRow


def _choice() -> Decision:
    return Decision(
        action="<action>1</action>", candidate_ids=((1,), (2,)), chosen=0, logprobs=(-0.7,)
    )


def _text(width: int) -> Decision:
    return Decision(action="x", response_ids=tuple(range(width)), logprobs=(-1.0,) * width)


def _rows() -> list[StepRow]:
    """Group 0: two episodes of two steps; group 1: one episode of one step (same anchor A)."""
    return [
        StepRow(traj=0, group=0, step=0, anchor="A", decision=_text(3), reward=0.2),
        StepRow(traj=0, group=0, step=1, anchor="B", decision=_text(2), reward=0.1),
        StepRow(traj=1, group=0, step=0, anchor="A", decision=_choice(), reward=0.0, valid=False),
        StepRow(traj=1, group=0, step=1, anchor="A", decision=_choice(), reward=0.3),
        StepRow(traj=2, group=1, step=0, anchor="A", decision=_choice(), reward=0.4),
    ]


def test_gigpo_episode_plus_anchor_step_groups_with_the_penalty_after_discounting():
    spec = GiGPOSpec(gamma=0.5, invalid_action_penalty=0.1, step_advantage_w=1.0)
    targets = compute_advantages(_rows(), spec)
    # Step returns: traj 0: 0.25, 0.1; traj 1: 0.15 - 0.1 (invalid) = 0.05, 0.3.
    # Episode scores per row: 0.3, 0.3, 0.3 - 0.1, 0.3 -> group mean 0.275.
    # Step group A of group 0: 0.25, 0.05, 0.3 (mean 0.2); B alone -> 0.
    expected = [0.025 + 0.05, 0.025 + 0.0, -0.075 - 0.15, 0.025 + 0.1, 0.4 + 0.0]
    widths = [3, 2, 1, 1, 1]
    assert [len(a) for a in targets.advantages] == widths
    for advantages, value in zip(targets.advantages, expected, strict=True):
        assert advantages == pytest.approx((value,) * len(advantages), abs=1e-9)
    assert targets.returns is None


def test_gigpo_step_weight_scales_only_the_step_term():
    spec = GiGPOSpec(gamma=0.5, invalid_action_penalty=0.1, step_advantage_w=0.0)
    targets = compute_advantages(_rows(), spec)
    assert [a[0] for a in targets.advantages] == pytest.approx([0.025, 0.025, -0.075, 0.025, 0.4])


def test_grpo_normalises_one_discounted_return_per_episode_within_its_group():
    targets = compute_advantages(_rows(), GRPOSpec(gamma=1.0, invalid_action_penalty=0.1))
    # Returns: traj 0: 0.3, traj 1: 0.2 (penalty), traj 2: 0.4 (a group of one keeps it).
    std = math.sqrt(2 * 0.05**2 / 1)
    a = 0.05 / (std + 1e-6)
    assert [t[0] for t in targets.advantages] == pytest.approx([a, a, -a, -a, 0.4], abs=1e-5)
    assert targets.advantages[0] == pytest.approx((a,) * 3, abs=1e-5)


def test_rloo_uses_the_mean_of_the_other_episodes():
    targets = compute_advantages(
        _rows(), GRPOSpec(gamma=1.0, invalid_action_penalty=0.1, leave_one_out=True)
    )
    assert [t[0] for t in targets.advantages] == pytest.approx([0.1, 0.1, -0.1, -0.1, 0.4])


def _gae_oracle(rewards, values, gamma, lam):
    advantages = [0.0] * len(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        following = values[t + 1] if t + 1 < len(values) else 0.0
        delta = rewards[t] + gamma * following - values[t]
        running = delta + gamma * lam * running
        advantages[t] = running
    return advantages, [a + v for a, v in zip(advantages, values, strict=True)]


def test_ppo_runs_gae_over_the_steps_of_each_episode_then_whitens():
    rows = _rows()
    values = [[0.5, 0.4, 0.3], [0.2, 0.1], [0.05], [0.3], [0.1]]
    spec = PPOSpec(gamma=0.9, lam=0.8, invalid_action_penalty=0.1)
    targets = compute_advantages(rows, spec, values=values)
    per_episode = {
        0: ([0.2, 0.1], [0.5, 0.2]),
        1: ([0.0 - 0.1, 0.3], [0.05, 0.3]),
        2: ([0.4], [0.1]),
    }
    raw, returns = [], []
    for rewards, v in per_episode.values():
        a, r = _gae_oracle(rewards, v, 0.9, 0.8)
        raw += a
        returns += r
    raw_arr = np.array(raw)
    whitened = (raw_arr - raw_arr.mean()) / np.sqrt(raw_arr.var(ddof=1) + 1e-8)
    assert [t[0] for t in targets.advantages] == pytest.approx(whitened.tolist(), abs=1e-9)
    assert targets.returns is not None and targets.old_values is not None
    assert [t[0] for t in targets.returns] == pytest.approx(returns, abs=1e-12)
    assert targets.returns[0] == pytest.approx((returns[0],) * 3)
    assert targets.old_values[0] == (0.5, 0.4, 0.3)  # the critic's values per token, as given


def test_ppo_needs_values():
    with pytest.raises(InvalidInputError, match="values"):
        compute_advantages(_rows(), PPOSpec())


def test_rows_with_nothing_to_train_still_count_in_their_episode():
    rows = _rows()
    rows[1] = StepRow(traj=0, group=0, step=1, anchor="B", decision=_text(0), reward=0.1)
    targets = compute_advantages(rows, GiGPOSpec(gamma=0.5, invalid_action_penalty=0.1))
    assert targets.advantages[1] == ()
    assert targets.advantages[0][0] == pytest.approx(0.075)


def test_sibling_rows_keep_the_episode_term_and_train_every_candidate_on_its_own_reward():
    rows = _rows()
    # Row 3 (traj 1, step 1, a choice of 2) had both listed actions stepped: rewards 0.3 (its
    # own, chosen 0) and -0.1.
    rows[3].candidate_rewards = (0.3, -0.1)
    rows[4].candidate_rewards = (0.4,)  # not every candidate: not a sibling group
    spec = GiGPOSpec(gamma=0.5, invalid_action_penalty=0.1, step_advantage_w=2.0)
    targets = compute_advantages(rows, spec)
    plain = compute_advantages(_rows(), spec)
    episode_only = compute_advantages(_rows(), spec.model_copy(update={"step_advantage_w": 0.0}))
    assert targets.advantages[3] == pytest.approx(episode_only.advantages[3])
    for i in (0, 1, 2, 4):
        assert targets.advantages[i] == pytest.approx(plain.advantages[i])
    assert targets.candidate_advantages is not None
    assert targets.candidate_advantages[3] == pytest.approx((2.0 * 0.2, 2.0 * -0.2))
    assert [targets.candidate_advantages[i] for i in (0, 1, 2, 4)] == [(), (), (), ()]
    std = GiGPOSpec(gamma=0.5, step_advantage_w=1.0, mode="mean_std_norm")
    normalised = compute_advantages(rows, std).candidate_advantages
    assert normalised is not None
    spread = math.sqrt(2 * 0.2**2)
    assert normalised[3] == pytest.approx((0.2 / (spread + 1e-6), -0.2 / (spread + 1e-6)))
    assert compute_advantages(_rows(), spec).candidate_advantages is None
