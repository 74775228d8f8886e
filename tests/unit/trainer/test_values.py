"""V(s) tables the trainer sends for fused selection: returns-to-go per anchor, or the critic."""

from __future__ import annotations

import pytest

from aflowrl.trainer.rows import Decision, StepRow
from aflowrl.trainer.values import ValueTable

A, B, C = "a" * 64, "b" * 64, "c" * 64


def _row(traj: int, step: int, anchor: str, reward: float) -> StepRow:
    return StepRow(
        traj=traj, group=0, step=step, anchor=anchor, decision=Decision("x"), reward=reward
    )


def test_anchor_mc_averages_the_returns_to_go_from_each_anchor():
    table = ValueTable("anchor-mc")
    # Episode 0: A (r=0.1) -> B (r=0.2); episode 1: A (r=-0.1) -> C (r=0.0).
    table.record([_row(0, 1, B, 0.2), _row(0, 0, A, 0.1), _row(1, 0, A, -0.1), _row(1, 1, C, 0.0)])
    sent = table.proto()
    assert sent.values[B] == pytest.approx(0.2) and sent.values[C] == pytest.approx(0.0)
    assert sent.values[A] == pytest.approx(((0.1 + 0.2) + (-0.1 + 0.0)) / 2)
    assert sent.default_value == 0.0
    again = ValueTable.from_dict(table.to_dict())
    assert dict(again.proto().values) == dict(sent.values)


def test_critic_values_keep_the_latest_and_default_to_their_mean():
    table = ValueTable("critic")
    table.record([_row(0, 0, A, 0.0), _row(0, 1, B, 0.0)], [0.5, 0.1])
    table.record([_row(1, 0, A, 0.0)], [0.3])
    sent = table.proto()
    assert dict(sent.values) == pytest.approx({A: 0.3, B: 0.1})
    assert sent.default_value == pytest.approx(0.2)
