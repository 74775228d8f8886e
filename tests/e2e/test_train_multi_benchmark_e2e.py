"""End to end: a short training over three benchmarks with one held out, through real services.

Every service is a real process started by the local launcher (two environment replicas with
the surrogate executor, each serving GSM8K, MATH, HumanEval and the held-out MBPP; an hf
rollout; a learner). The data are the first problems of AFlow's real split files, so the final
comparison (every workflow on the whole validation and test splits) stays short. Checked: every
iteration's groups cover the three training benchmarks and never MBPP, the records carry
per-benchmark scalars, ``best/`` holds one folder per training benchmark, the final comparison
is one table per training benchmark plus MBPP's transfer table, and the final policy is played
on held-out tasks of all four benchmarks (``held_out.json``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from aflowrl.config import RunSpec
from aflowrl.local.launcher import local_services, local_spec
from aflowrl.trainer import app
from aflowrl.trainer.tasks import is_held_out_seed

pytestmark = pytest.mark.slow

TRAINING = ("gsm8k", "math", "humaneval")

SPEC = """
policy: {dtype: float32}
learner:
  fsdp: {mixedPrecision: none}
  optimizer: {lr: 0.01}
  loss: {miniBatchSize: 8, microBatchSize: 8, klCoef: 0.0}
environment:
  benchmarks: [gsm8k, math, humaneval]
  heldOutBenchmarks: [mbpp]
  evaluation: {maxProblems: 4, repeats: 1}
  search: {maxSteps: 2, maxAdmissibleActions: 6, maxObservationChars: 1500}
trainer: {iterations: 2, tasksPerIteration: 3, groupSize: 2, checkpointEvery: 0}
"""
"""2 iterations of 3 tasks (one per benchmark: equal weights) x 2 episodes x 2 steps."""


SPLIT_PROBLEMS = {"validate": 12, "test": 16}


@pytest.fixture
def small_data(aflow_data: Path, tmp_path: Path) -> Path:
    """The first problems of each split of the four benchmarks (public example tests whole)."""
    directory = tmp_path / "data"
    directory.mkdir()
    for name in (*TRAINING, "mbpp"):
        for split, count in SPLIT_PROBLEMS.items():
            lines = (aflow_data / f"{name}_{split}.jsonl").read_text().splitlines()[:count]
            (directory / f"{name}_{split}.jsonl").write_text("\n".join(lines) + "\n")
        public = aflow_data / f"{name}_public_test.jsonl"
        if public.is_file():
            shutil.copy(public, directory / public.name)
    return directory


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


async def test_a_run_over_three_benchmarks_with_one_held_out(tmp_path, small_data):
    doc = RunSpec.from_yaml(SPEC).to_document()
    doc["environment"]["data"]["dir"] = str(small_data)
    run_dir = tmp_path / "run"
    spec = local_spec(RunSpec.from_document(doc), run_dir)
    async with local_services(spec, run_dir) as (targets, _group):
        services = app.connect(
            spec, env=targets.env, rollout=targets.rollout, learner=targets.learner
        )
        result = await app.train(spec, services, run_dir)
    records = _records(run_dir)
    assert [r["iteration"] for r in records] == [0, 1]
    for record in records:
        assert record["charts/episodes"] == 6 and record["charts/steps"] == 12
        assert record["charts/rows_trained"] > 0 and np.isfinite(record["losses/policy"])
        # Three groups, one per benchmark; the held-out one never drawn.
        assert {b: record[f"charts/episodes/{b}"] for b in TRAINING} == dict.fromkeys(TRAINING, 2)
        assert not any("mbpp" in key for key in record)
        for name in TRAINING:
            assert 0.0 <= record[f"charts/best_score/{name}"] <= 1.0
            assert np.isfinite(record[f"charts/episode_return/{name}"])
        best = [record[f"charts/best_score/{b}"] for b in TRAINING]
        assert record["charts/best_score"] == pytest.approx(np.mean(best))
    # Best workflows per training benchmark.
    assert sorted(p.name for p in (run_dir / "best").iterdir()) == sorted(TRAINING)
    for name in TRAINING:
        index = json.loads((run_dir / "best" / name / "index.json").read_text())
        assert index and index[0]["dir"].startswith(f"best/{name}/")
        assert index[0]["validation_score"] == result.state.best[name][0].score
    assert set(result.best_dirs) == set(TRAINING) and result.best_dir is None
    # The final tables: one per training benchmark, then MBPP's transfer table.
    final = json.loads((run_dir / "final.json").read_text())
    assert list(dict.fromkeys(row["benchmark"] for row in final)) == [*TRAINING, "mbpp"]
    for name in (*TRAINING, "mbpp"):
        rows = [row for row in final if row["benchmark"] == name]
        names = {row["name"] for row in rows}
        assert {"seed", "io", "cot", "cot_sc", "medprompt", "self_refine"} <= names
        assert all(row["held_out"] == (name == "mbpp") for row in rows)
        assert all(0.0 <= row["test_mean"] <= 1.0 for row in rows)
        assert all(row["num_problems"] == SPLIT_PROBLEMS["test"] for row in rows)
    transferred = [r["name"] for r in final if r["benchmark"] == "mbpp" and "best of" in r["name"]]
    assert all(name.startswith("best of humaneval") for name in transferred)  # code only
    text = (run_dir / "final.md").read_text()
    for name in TRAINING:
        assert f"classic baselines on {name} (test split)" in text
    assert "Held-out mbpp (never trained on)" in text
    assert "The final policy on held-out tasks" in text
    # The final policy on held-out tasks of every served benchmark.
    held_out = json.loads((run_dir / "held_out.json").read_text())
    summaries = {s["benchmark"]: s for s in held_out["summaries"]}
    assert list(summaries) == [*TRAINING, "mbpp"] and summaries["mbpp"]["held_out"]
    assert all(s["episodes"] == 3 * 2 for s in summaries.values())
    assert all(is_held_out_seed(e["seed"]) for e in held_out["episodes"])
    assert len(result.held_out) == 4 * 3 * 2
