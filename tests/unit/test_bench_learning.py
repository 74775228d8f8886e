"""bench/learning.py's oracle values (--value-ceiling), the --transfer-ceiling arithmetic against
hand-computed figures, where --try-iterations finds its checkpoints, and how --from-dump joins
runs of other seeds."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from aflowrl.trainer.state import CheckpointEntry, CheckpointIndex

BENCH = Path(__file__).resolve().parents[2] / "bench" / "learning.py"


def _bench() -> ModuleType:
    name = "bench_learning_under_test"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCH)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while it loads
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_one_step_values_are_the_proposers_expected_gain_and_the_best_gain() -> None:
    bench = _bench()
    # Parent 0.5; children 0.6 (+0.1), 0.4 (no gain: the improvement reward is never
    # negative), 0.8 (+0.3) and 0.5 (none).
    expected, best = bench.one_step_values(0.5, [0.6, 0.4, 0.8, 0.5], [0.25] * 4)
    assert expected == pytest.approx((0.1 + 0.3) / 4)
    assert best == pytest.approx(0.3)
    # A policy that puts its mass on the losing child expects less than uniform.
    expected, best = bench.one_step_values(0.5, [0.6, 0.4, 0.8, 0.5], [0.0, 0.7, 0.1, 0.2])
    assert expected == pytest.approx(0.1 * 0.3)
    assert best == pytest.approx(0.3)


def test_one_step_values_of_a_workflow_no_child_improves_are_zero() -> None:
    bench = _bench()
    assert bench.one_step_values(0.9, [0.2, 0.9], [0.5, 0.5]) == (0.0, 0.0)
    assert bench.one_step_values(0.4, [], []) == (0.0, 0.0)


def test_one_step_values_refuse_probabilities_that_do_not_match_the_children() -> None:
    with pytest.raises(ValueError, match="2 probabilities for 3 children"):
        _bench().one_step_values(0.5, [0.1, 0.2, 0.3], [0.5, 0.5])


def test_effective_weight_of_scaled_values_at_fused_w_one_half() -> None:
    bench = _bench()
    # (1 - w) UCB + w (k V) ranks as (1 - w') UCB + w' V with w' / (1 - w') = k w / (1 - w).
    assert bench.effective_weight(0.5, 1.0) == pytest.approx(0.5)
    assert bench.effective_weight(0.5, 4.0) == pytest.approx(0.8)
    assert bench.effective_weight(0.5, 0.0) == 0.0
    assert bench.effective_weight(0.2, 4.0) == pytest.approx(0.5)
    assert bench.effective_weight(1.0, 3.0) == 1.0


def test_oracle_values_of_each_kind_from_the_sample_one_scores() -> None:
    bench = _bench()
    value = bench.OracleValue(0.5, (0.6, 0.4, 0.8, 0.5))
    assert value.of("expected") == pytest.approx(0.1)
    assert value.of("best") == pytest.approx(0.3)
    # Greedy: the gain over the tree's best (0.7), not over s: only the 0.8 child raises it.
    assert value.of("greedy", 0.7) == pytest.approx(0.1 / 4)
    # The tree's best is never below s's own score (s is in the tree).
    assert value.of("greedy", 0.2) == pytest.approx(value.of("expected"))
    assert bench.OracleValue(0.5, ()).of("greedy", 0.1) == 0.0


def test_same_sample_greedy_value_reads_sample_zero_and_its_own_best_so_far() -> None:
    bench = _bench()
    value = bench.OracleValue(0.5, (0.6, 0.4), parent_same=0.45, children_same=(0.7, 0.3))
    assert value.of("greedy-same", 0.5) == pytest.approx(0.2 / 2)
    table = bench.OracleTable("greedy-same", 2.0)
    table.add("a" * 64, value)
    table.add("c" * 64, bench.OracleValue(0.9, (0.9,), parent_same=0.65, children_same=(0.66,)))
    # The bar is the best sample-0 score added (0.65), not sample 1's 0.9.
    assert table.best_so_far == pytest.approx(0.65)
    assert dict(table.proto().values) == pytest.approx(
        {"a" * 64: 2.0 * 0.05 / 2, "c" * 64: 2.0 * 0.01}
    )


def test_oracle_table_sends_its_live_values_scaled() -> None:
    bench = _bench()
    table = bench.OracleTable("expected", 4.0)
    snapshot = table.snapshot()
    table.add("a" * 64, bench.OracleValue(0.5, (0.6, 0.5)))  # after the collector's snapshot
    sent = snapshot.proto({"b" * 64: 9.0})  # the proposer's own values are not sent
    assert dict(sent.values) == pytest.approx({"a" * 64: 4.0 * 0.05})
    assert sent.default_value == 0.0


def test_greedy_oracle_table_values_every_node_against_the_best_added_so_far() -> None:
    bench = _bench()
    table = bench.OracleTable("greedy", 1.0)
    table.add("a" * 64, bench.OracleValue(0.5, (0.6, 0.9)))
    assert table.value("a" * 64) == pytest.approx((0.1 + 0.4) / 2)
    # A child scoring 0.7 raises the bar for its parent too.
    table.add("c" * 64, bench.OracleValue(0.7, (0.75, 0.6)))
    sent = dict(table.proto().values)
    assert sent == pytest.approx({"a" * 64: 0.2 / 2, "c" * 64: 0.05 / 2})


def test_cells_for_two_se_grow_as_the_square_of_the_missing_z() -> None:
    bench = _bench()
    # A lead at +1.0 SE on 14 cells: +2 SE needs (2 / 1)^2 = 4 times the cells, the effect held.
    assert bench.cells_for(2.0, bench.Figure(0.03, 0.03), 14) == pytest.approx(56.0)
    # Already at +4 SE: a quarter of the cells would do.
    assert bench.cells_for(2.0, bench.Figure(0.04, 0.01), 14) == pytest.approx(3.5)
    # A lead that is not positive gets there at no size.
    assert bench.cells_for(2.0, bench.Figure(-0.01, 0.02), 14) == float("inf")
    assert bench.cells_for(2.0, bench.Figure(0.0, 0.02), 14) == float("inf")
    # A deterministic lead (SE zero) needs no cells beyond the ones it has shown.
    assert bench.cells_for(2.0, bench.Figure(0.01, 0.0), 14) == 0.0


def test_checkpoints_at_each_count_kept_until_the_end(tmp_path: Path) -> None:
    learning = _bench()
    fields = learning.checkpoints_at([8, 12, 16])
    assert fields == {"iterations": 16, "checkpointEvery": 4, "keepCheckpoints": 4}
    saved = [i for i in range(1, 17) if i % fields["checkpointEvery"] == 0]
    assert {8, 12, 16} <= set(saved[-fields["keepCheckpoints"] :])
    index = CheckpointIndex(tmp_path)
    for i in saved:
        index.add(CheckpointEntry(i, str(tmp_path / f"ckpt-{i}"), i), fields["keepCheckpoints"])
    assert learning.checkpoint(tmp_path, 12) == tmp_path / "ckpt-12"
    with pytest.raises(RuntimeError, match="no checkpoint after 10 iterations"):
        learning.checkpoint(tmp_path, 10)


def _dump(seed: int, gain: float, states: list[Any]) -> dict[str, Any]:
    learning = _bench()
    method = learning.Method("gigpo")
    method.gain.add("task-a", seed, gain)
    method.onestep.add("task-a", seed, gain / 2)
    method.moved.append(0.5 + seed)
    return {
        "methods": {"gigpo": method},
        "states": states,
        "tv": [0.1 * seed],
        "shuffle": [(0.1, 0.6)],
        "phases": {"play gigpo": 10.0},
        "cpu": {"play gigpo": 15.0},
        "greedy_fits": [(0.02, 0.01)],
    }


def test_dumps_of_disjoint_seeds_merge_into_one_run_of_all_seeds() -> None:
    learning = _bench()
    states = [SimpleNamespace(task="a", text="state one"), SimpleNamespace(task="b", text="two")]
    reordered = states[::-1]
    merged = learning.merge_dumps([_dump(0, 0.1, states), _dump(2, 0.3, reordered)], [0, 2])
    gigpo = merged["methods"]["gigpo"]
    assert gigpo.gain.values == {("task-a", 0): [0.1], ("task-a", 2): [0.3]}
    assert gigpo.onestep.matrix(["task-a"], [0, 2]).tolist() == [[0.05, 0.15]]
    assert gigpo.moved == [0.5, 2.5]
    assert merged["tv"] == [0.0, 0.2] and len(merged["shuffle"]) == 2
    assert merged["phases"] == {"play gigpo": 20.0} and merged["cpu"] == {"play gigpo": 30.0}
    assert merged["states"] is states and merged["greedy_fits"] == [(0.02, 0.01)]


def test_dumps_that_share_a_seed_or_miss_one_are_refused() -> None:
    learning = _bench()
    states = [SimpleNamespace(task="a", text="state one")]
    with pytest.raises(ValueError, match="share seeds"):
        learning.merge_dumps([_dump(1, 0.1, states), _dump(1, 0.3, states)], [1])
    with pytest.raises(ValueError, match=r"hold seeds \[0, 2\], --seeds lists \[0, 1, 2\]"):
        learning.merge_dumps([_dump(0, 0.1, states), _dump(2, 0.3, states)], [0, 1, 2])
    ceiling = {**_dump(2, 0.3, states), "ceiling_values": [(0.1, 0.2)]}
    with pytest.raises(ValueError, match="read alone"):
        learning.merge_dumps([_dump(0, 0.1, states), ceiling], [0, 2])
    other = [SimpleNamespace(task="a", text="another state")]
    with pytest.raises(ValueError, match="held-out states differ"):
        learning.merge_dumps([_dump(0, 0.1, states), _dump(2, 0.3, other)], [0, 2])
