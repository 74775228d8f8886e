"""The run's pictures: curves whose axes fit the data with the update diagnostics, and the
search tree of an episode (recorded in trees.jsonl, drawn by ``aflowrl plot --tree``)."""

from __future__ import annotations

import pytest

from aflowrl.trainer import plots, trees
from aflowrl.trainer.records import RunDirectory
from aflowrl.trainer.rows import Decision, Episode, StepRow

PNG = b"\x89PNG\r\n\x1a\n"


def _records(n: int = 5) -> list[dict]:
    return [
        {
            "iteration": i,
            "charts/episode_return": 0.01 * i,
            "charts/episode_return_std": 0.005,
            "charts/best_score": 0.80 + 0.01 * i,
            "charts/iteration_best_score": 0.80 + 0.005 * i,
            "charts/seed_score": 0.80,
            "losses/kl": 0.001 * i,
            "charts/approx_kl": 0.002,
            "charts/clipfrac": 0.1 + 0.01 * i,
            "policy/update_tv": 0.02,
            "losses/entropy": 1.5,
            "time/iteration": 3.0,
        }
        for i in range(n)
    ]


def _panels(records) -> dict:
    figure = plots.curves_figure(records)
    return {ax.get_title(): ax for ax in figure.axes if ax.get_visible()}


def test_the_score_axis_fits_the_scores_not_zero_to_one():
    low, high = _panels(_records())["Validation score"].get_ylim()
    assert 0.79 < low < 0.80 and 0.84 < high < 0.85  # scores 0.80..0.84 with a margin


def test_the_update_diagnostics_have_panels_when_recorded():
    panels = _panels(_records())
    assert {"Episode return", "Validation score", "KL", "Total variation", "Clip fraction"} <= set(
        panels
    )
    assert "Entropy" in panels and "Gradient norm" not in panels  # no grad norm recorded
    low, high = panels["Clip fraction"].get_ylim()
    assert 0.09 < low < 0.1 and 0.14 < high < 0.15


def test_a_flat_line_gets_a_small_band_around_it():
    assert plots.axis_limits([0.5, 0.5]) == pytest.approx((0.475, 0.525))
    assert plots.axis_limits([0.0]) == pytest.approx((-0.05, 0.05))
    assert plots.axis_limits([]) == (0.0, 1.0)
    low, high = plots.axis_limits([1.0, 3.0])
    assert low == pytest.approx(0.84) and high == pytest.approx(3.16)


def test_curves_without_learner_metrics_still_draw(tmp_path):
    records = [
        {k: v for k, v in r.items() if k.startswith(("iteration", "charts/"))} for r in _records(2)
    ]
    assert plots.curves_png(records).startswith(PNG)


def _episode() -> Episode:
    """seed -> a (valid), seed -> invalid, a -> b, b -> a (a duplicate)."""
    rows = [
        StepRow(
            0,
            0,
            0,
            "seed" + "0" * 60,
            Decision("add ScEnsemble after generate n=5"),
            reward=0.1,
            child_hash="a" * 64,
            child_score=0.9,
            parent_score=0.8,
            best_score=0.9,
        ),
        StepRow(
            0,
            0,
            1,
            "seed" + "0" * 60,
            Decision("nonsense"),
            reward=0.0,
            valid=False,
            parent_score=0.8,
            best_score=0.9,
        ),
        StepRow(
            0,
            0,
            2,
            "a" * 64,
            Decision("x"),
            canonical_action="add Review after ensemble",
            reward=-0.05,
            child_hash="b" * 64,
            child_score=0.85,
            parent_score=0.9,
            best_score=0.9,
        ),
        StepRow(
            0,
            0,
            3,
            "b" * 64,
            Decision("remove review"),
            child_hash="a" * 64,
            child_score=0.9,
            parent_score=0.85,
            best_score=0.9,
            duplicate=True,
        ),
    ]
    return Episode(0, 0, 7, "it3-g0-e0", benchmark="humaneval", seed_score=0.8, rows=rows)


def test_an_episodes_tree_has_its_workflows_and_steps():
    tree = trees.episode_tree(_episode(), iteration=3, root="unused")
    assert tree["root"] == "seed00000000"
    assert tree["nodes"] == {"seed00000000": 0.8, "a" * 12: 0.9, "b" * 12: 0.85}
    assert [
        (e["parent"][:4], e["child"][:4], e["valid"], e["duplicate"]) for e in tree["edges"]
    ] == [
        ("seed", "aaaa", True, False),
        ("seed", "", False, False),
        ("aaaa", "bbbb", True, False),
        ("bbbb", "aaaa", True, True),
    ]
    assert tree["edges"][2]["action"] == "add Review after ensemble"  # the canonical text


def test_an_episode_without_steps_is_its_seed():
    lone = Episode(0, 0, 1, "e", benchmark="gsm8k", seed_score=0.5)
    tree = trees.episode_tree(lone, iteration=0, root="f" * 64)
    assert tree["nodes"] == {"f" * 12: 0.5} and tree["edges"] == []
    assert plots.tree_png(tree).startswith(PNG)


def test_the_best_episode_is_the_one_with_the_highest_score():
    low = Episode(0, 0, 1, "low", seed_score=0.5)
    high = _episode()
    assert trees.best_episode([low, high, Episode(2, 0, 1, "tie", seed_score=0.9)]) is high
    assert trees.best_episode([]) is None


def test_layout_puts_children_below_their_parent():
    tree = trees.episode_tree(_episode(), iteration=3, root="unused")
    position = plots.tree_layout(tree)
    assert position["seed00000000"][1] == 0
    assert position["a" * 12][1] == 1 and position["b" * 12][1] == 2
    assert plots.tree_png(tree).startswith(PNG)


def test_a_resume_drops_the_trees_of_undone_iterations(tmp_path):
    run = RunDirectory(tmp_path)
    for i in range(4):
        run.append_metrics({"iteration": i})
        run.append_tree(trees.episode_tree(_episode(), iteration=i, root="r"))
    assert run.truncate_metrics(2) == 2
    assert [t["iteration"] for t in run.read_trees()] == [0, 1]
