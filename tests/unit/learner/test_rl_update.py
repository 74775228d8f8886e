"""What one RL update does to the policy, on the real learner (the tiny model, one rank).

Each case runs in a fresh spawned process: the learner joins a one-rank process group, which
belongs to its process and must not outlive the case.

- An update on a fixed batch moves the policy in the direction of the advantages (sampled
  actions, and every candidate with sibling step groups), by a non-zero amount the clipped
  objective and the KL to the reference keep bounded; the update's own diagnostics report it.
- The first RL update after the supervised warm start starts a fresh optimiser (moments and
  step count) and makes the current weights the KL reference, unless
  ``trainer.warmStart.keepOptimizerState``.
"""

from __future__ import annotations

from typing import Any

import pytest
from spawned_case import in_fresh_process

SPEC = """
policy: {{model: tiny, dtype: float32}}
learner:
  fsdp: {{mixedPrecision: none}}
  optimizer: {{lr: 0.002}}
  loss: {{miniBatchSize: 8, microBatchSize: 4, epochs: 4, klCoef: {kl}, klEstimator: exact}}
trainer:
  warmStart: {{episodes: 4, lr: 0.003, keepOptimizerState: {keep}}}
"""

CANDIDATES = ((11, 12, 13), (14, 15), (16, 17, 18, 19), (20, 21))


def _learner(kl: float = 0.0, keep: bool = False) -> Any:
    import torch

    from aflowrl.config import RunSpec
    from aflowrl.learner.distributed import init_distributed
    from aflowrl.learner.worker import Learner

    torch.set_num_threads(1)
    spec = RunSpec.from_yaml(SPEC.format(kl=kl, keep=str(keep).lower()), source="test")
    return Learner(spec, init_distributed())


def _items(count: int) -> list[Any]:
    from aflowrl.learner.batching import ChoiceItem

    return [
        ChoiceItem(
            prompt=tuple(30 + (7 * i + j) % 40 for j in range(12)),
            candidates=CANDIDATES,
            chosen=i % 2,
            length_normalised=True,
        )
        for i in range(count)
    ]


def _log_pi(learner: Any, items: list[Any]) -> Any:
    import torch

    scores = learner.compute_logprobs(items, reference=False, entropies=False, values=False)
    return torch.tensor([s.candidates for s in scores], dtype=torch.float64)


def _update_case(*, siblings: bool) -> dict[str, Any]:
    import torch

    from aflowrl.learner.batching import TrainRow

    learner = _learner(kl=0.05)
    items = _items(16)
    before = _log_pi(learner, items)
    rows = []
    for item, old in zip(items, before, strict=True):
        # Sampled: +1 where candidate 0 was chosen, -1 where candidate 1 was. Siblings: every
        # candidate's own advantage, the sampled term off.
        sampled = 0.0 if siblings else (1.0 if item.chosen == 0 else -1.0)
        rows.append(
            TrainRow(
                item,
                (float(old[item.chosen]),),
                (sampled,),
                candidate_old_logprobs=tuple(float(v) for v in old),
                candidate_advantages=(1.0, -1.0, 0.0, 0.0) if siblings else None,
            )
        )
    metrics = learner.train(rows, iteration=0)
    after = _log_pi(learner, items)
    p, q = before.exp(), after.exp()
    return {
        "up": float((after[:, 0] - before[:, 0]).mean()),
        "down": float((after[:, 1] - before[:, 1]).mean()),
        "tv": float(0.5 * (p - q).abs().sum(dim=-1).mean()),
        "kl": float((p * (before - after)).sum(dim=-1).mean()),
        "metrics": metrics,
        "ratio_max": float(torch.exp(after - before).max()),
    }


@pytest.mark.parametrize("siblings", [False, True], ids=["sampled", "siblings"])
def test_an_update_moves_the_policy_towards_the_advantages_by_a_bounded_amount(siblings):
    result = in_fresh_process(_update_case, siblings=siblings)
    assert result["up"] > 0 > result["down"]
    assert 0.005 < result["tv"] < 0.35
    metrics = result["metrics"]
    # The learner's own account of the update agrees with what the test measured.
    assert metrics["policy/update_kl"] == pytest.approx(result["kl"], rel=1e-3, abs=1e-6)
    assert metrics["policy/update_tv"] == pytest.approx(result["tv"], rel=1e-3, abs=1e-6)
    # The reference is the policy before the update: the distance from it is the update's.
    assert metrics["policy/start_tv"] == pytest.approx(result["tv"], rel=1e-3, abs=1e-6)
    assert metrics["policy/param_distance"] > 0
    assert metrics["perf/optimizer_steps"] == 8  # 16 rows / 8 per mini-batch x 4 epochs
    key = "charts/candidate_clipfrac" if siblings else "charts/clipfrac"
    assert 0.0 <= metrics[key] <= 1.0


def _phase_case(*, keep: bool) -> dict[str, Any]:
    from aflowrl.learner.batching import TrainRow

    learner = _learner(kl=0.05, keep=keep)
    items = _items(8)
    targets = (0.7, 0.1, 0.1, 0.1)
    supervised = [TrainRow(i, (), (), target_weights=targets) for i in items]
    for _ in range(3):
        learner.train(supervised, iteration=0, supervised=True)
    sft_steps = learner.state.step
    warm = [p.detach().clone() for p in learner.policy.module.parameters()]
    reference_before = learner.compute_logprobs(
        items, reference=True, entropies=False, values=False
    )
    current = _log_pi(learner, items)
    rows = [
        TrainRow(
            item,
            (float(old[item.chosen]),),
            (1.0 if item.chosen == 0 else -1.0,),
            candidate_old_logprobs=tuple(float(v) for v in old),
        )
        for item, old in zip(items, current, strict=True)
    ]
    metrics = learner.train(rows, iteration=0)
    reference_after = learner.compute_logprobs(items, reference=True, entropies=False, values=False)
    adam_steps = {
        int(learner.optimizer.state[p]["step"]) for p in learner.policy.trainable_parameters()
    }
    reference = dict(learner.policy.reference.named_parameters())
    anchored = all(
        bool((reference[name] == value).all())
        for (name, _), value in zip(learner.policy.module.named_parameters(), warm, strict=True)
        if name in reference
    )
    return {
        "sft_steps": sft_steps,
        "rl_steps": int(metrics["perf/optimizer_steps"]),
        "adam_steps": sorted(adam_steps),
        "phase_step": learner.state.phase_step,
        "reset": metrics.get("charts/optimizer_reset", 0.0),
        "anchored": anchored,
        "reference_moved": max(
            abs(a - b)
            for x, y in zip(reference_before, reference_after, strict=True)
            for a, b in zip(x.candidates, y.candidates, strict=True)
        ),
        "reference_is_warm": max(
            abs(a - float(b))
            for x, row in zip(reference_after, current, strict=True)
            for a, b in zip(x.candidates, row, strict=True)
        ),
    }


def test_rl_after_the_warm_start_starts_a_fresh_optimiser_and_reference():
    result = in_fresh_process(_phase_case, keep=False)
    assert result["sft_steps"] == 3
    # AdamW's step count restarted: the supervised phase's moments are gone.
    assert result["adam_steps"] == [result["rl_steps"]]
    assert result["phase_step"] == result["rl_steps"] and result["reset"] == 1.0
    # The KL reference became the warm start's weights at the first RL update.
    assert result["anchored"]
    assert result["reference_moved"] > 1e-3
    assert result["reference_is_warm"] < 1e-5


def test_keep_optimizer_state_carries_the_moments_into_rl():
    result = in_fresh_process(_phase_case, keep=True)
    assert result["adam_steps"] == [result["sft_steps"] + result["rl_steps"]]
    assert result["reset"] == 0.0
    assert result["anchored"]  # the reference still follows the policy RL starts from
