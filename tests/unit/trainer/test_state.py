"""The trainer's checkpointed state, the checkpoint index and the exactly-once metrics file."""

from __future__ import annotations

import json

import pytest

from aflowrl.config import RunSpec
from aflowrl.trainer.errors import ResumeError
from aflowrl.trainer.records import RunDirectory
from aflowrl.trainer.state import (
    BestWorkflow,
    CheckpointEntry,
    CheckpointIndex,
    TrainerState,
    spec_fingerprint,
)


def _state(spec: RunSpec | None = None) -> TrainerState:
    spec = spec or RunSpec()
    return TrainerState(seed=spec.trainer.seed, fingerprint=spec_fingerprint(spec))


def test_state_round_trips_through_client_state_bytes():
    state = _state()
    state.iteration, state.policy_version, state.metrics_lines = 7, 7, 7
    state.offer("humaneval", BestWorkflow("h1", 0.8, 3, "it3-g0-e1", '{"x": 1}'), keep=5)
    state.last_record = {"iteration": 6, "charts/episode_return": 0.1}
    again = TrainerState.from_bytes(state.to_bytes(), source="ckpt")
    assert again == state


def test_unreadable_or_foreign_state_is_refused_naming_the_checkpoint():
    with pytest.raises(ResumeError, match="ckpt-3: unreadable"):
        TrainerState.from_bytes(b"\x00not json", source="ckpt-3")
    doc = json.loads(_state().to_bytes())
    doc["format"] = 99
    with pytest.raises(ResumeError, match="format 99"):
        TrainerState.from_bytes(json.dumps(doc).encode(), source="ckpt-3")


def test_best_keeps_distinct_workflows_by_mean_validation_score():
    state = _state()
    state.offer("humaneval", BestWorkflow("a", 0.9, 0, "e0"), keep=2)
    state.offer("humaneval", BestWorkflow("b", 0.7, 0, "e1"), keep=2)
    state.offer("humaneval", BestWorkflow("a", 0.5, 1, "e2", "{}"), keep=2)  # again: mean 0.7
    best = state.best["humaneval"]
    assert [(b.hash, b.score, b.evaluations) for b in best] == [("a", 0.7, 2), ("b", 0.7, 1)]
    assert best[0].workflow_json == "{}"  # the graph fills in once known
    state.offer("humaneval", BestWorkflow("c", 0.95, 2, "e3"), keep=2)
    assert [b.hash for b in state.best["humaneval"]] == ["c", "a"] and state.best_score == 0.95


def test_best_lists_are_kept_per_benchmark_and_the_run_score_is_their_mean():
    state = _state()
    # The same workflow (the math seed serves gsm8k and math) is scored apart on each.
    state.offer("gsm8k", BestWorkflow("seed", 0.9, 0, "seed"), keep=2)
    state.offer("math", BestWorkflow("seed", 0.4, 0, "seed"), keep=2)
    state.offer("math", BestWorkflow("m1", 0.6, 1, "e1"), keep=2)
    assert [b.hash for b in state.best["gsm8k"]] == ["seed"]
    assert [(b.hash, b.evaluations) for b in state.best["math"]] == [("m1", 1), ("seed", 1)]
    assert state.best_score == pytest.approx((0.9 + 0.6) / 2)
    again = TrainerState.from_bytes(state.to_bytes(), source="ckpt")
    assert again == state


def test_a_format_1_state_of_one_benchmark_resumes():
    spec = RunSpec.from_document({"environment": {"benchmarks": ["mbpp"]}})
    old = {
        "seed": 0,
        "fingerprint": {
            **{k: v for k, v in spec_fingerprint(spec).items() if not k.startswith("env")},
            "environment.benchmark": "mbpp",
        },
        "iteration": 4,
        "best": [{"hash": "a", "score": 0.8, "iteration": 3, "episode": "e"}],
        "format": 1,
    }
    state = TrainerState.from_bytes(json.dumps(old).encode(), source="ckpt-4")
    assert state.format == 2 and state.iteration == 4
    assert [b.hash for b in state.best["mbpp"]] == ["a"]
    state.check_resumable(spec)  # the same run, in the new vocabulary
    with pytest.raises(ResumeError, match=r"environment\.benchmarks"):
        state.check_resumable(RunSpec.from_document({"environment": {"benchmarks": ["gsm8k"]}}))


def test_resuming_with_another_spec_names_every_changed_field():
    state = _state()
    other = RunSpec.from_document(
        {"trainer": {"seed": 3, "groupSize": 8}, "environment": {"benchmarks": ["mbpp"]}}
    )
    with pytest.raises(ResumeError) as info:
        state.check_resumable(other)
    text = str(info.value)
    assert "spec.trainer.seed: the run was 0, the spec says 3" in text
    assert "spec.trainer.groupSize" in text and "spec.environment.benchmarks" in text
    state.check_resumable(RunSpec.from_document({"trainer": {"iterations": 50}}))  # allowed


def test_the_index_keeps_the_newest_and_deletes_older_checkpoints(tmp_path):
    index = CheckpointIndex(tmp_path)
    for iteration in (2, 4, 6):
        folder = tmp_path / "checkpoints" / f"iter-{iteration:06d}"
        folder.mkdir(parents=True)
        index.add(CheckpointEntry(iteration, str(folder), iteration), keep=2)
    assert [e.iteration for e in index.entries()] == [4, 6]
    assert not (tmp_path / "checkpoints" / "iter-000002").exists()
    assert (tmp_path / "checkpoints" / "iter-000004").is_dir()
    index.discard_after(4)
    assert [e.iteration for e in index.entries()] == [4]
    (tmp_path / "checkpoints.json").write_text("{broken")
    with pytest.raises(ResumeError, match=r"checkpoints\.json: unreadable"):
        index.entries()


def test_metrics_keep_every_iteration_once_across_a_resume(tmp_path):
    run = RunDirectory(tmp_path)
    for iteration in range(5):
        run.append_metrics({"iteration": iteration, "charts/x": float(iteration)})
    with run.metrics_file.open("a") as out:
        out.write('{"iteration": 5, "charts/x"')  # torn by a crash mid-write
    assert [r["iteration"] for r in run.read_metrics()] == [0, 1, 2, 3, 4]
    assert run.truncate_metrics(3) == 2  # resumed from the checkpoint after iteration 2
    for iteration in range(3, 6):
        run.append_metrics({"iteration": iteration, "charts/x": float("nan")})
    records = run.read_metrics()
    assert [r["iteration"] for r in records] == [0, 1, 2, 3, 4, 5]
    assert records[4]["charts/x"] is None  # NaN is written as null
