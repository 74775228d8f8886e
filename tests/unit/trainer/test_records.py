"""The run directory's files, the curves, the progress display and the phase clock."""

from __future__ import annotations

import io
import json
import logging

import pytest
import yaml

from aflowrl.config import RunSpec
from aflowrl.trainer.clock import Timeline
from aflowrl.trainer.final import FinalRow, final_table
from aflowrl.trainer.progress import Progress, summary_line
from aflowrl.trainer.records import RunDirectory
from aflowrl.trainer.state import BestWorkflow
from aflowrl.workflow import library

PNG = b"\x89PNG\r\n\x1a\n"


def _record(iteration: int) -> dict:
    return {
        "iteration": iteration,
        "charts/episode_return": 0.01 * iteration,
        "charts/episode_return_std": 0.02,
        "charts/best_score": 0.8 + 0.01 * iteration,
        "charts/iteration_best_score": 0.8,
        "charts/seed_score": 0.75,
        "charts/valid_action_ratio": 0.875,
        "time/generate": 1.25,
        "time/step": 8.0,
        "time/train": 0.5,
        "time/checkpoint": 0.0,
    }


def test_spec_is_written_resolved(tmp_path):
    run = RunDirectory(tmp_path)
    path = run.write_spec(RunSpec())
    assert RunSpec.from_document(yaml.safe_load(path.read_text())) == RunSpec()


def test_curves_are_a_png_of_the_metrics(tmp_path):
    run = RunDirectory(tmp_path)
    assert run.plot_curves() is None
    for i in range(4):
        run.append_metrics(_record(i))
    png = run.plot_curves()
    assert png is not None and png.read_bytes().startswith(PNG)


def test_best_workflows_as_json_aflow_code_and_picture(tmp_path):
    run = RunDirectory(tmp_path)
    good = library.load("cot_sc", "code")
    seed = library.load("seed", "code")
    best = [
        BestWorkflow(good.content_hash, 0.9, 4, "it4-g0-e1", good.to_json()),
        BestWorkflow(seed.content_hash, 0.8, 0, "seed", seed.to_json()),
        BestWorkflow("f" * 64, 0.7, 2, "it2-g1-e0", None),  # known by its hash only
    ]
    root = run.write_best(best, benchmark="humaneval")
    index = json.loads((root / "index.json").read_text())
    assert [e["hash"] for e in index] == [b.hash for b in best]
    first = root / f"1-{good.content_hash[:12]}"
    assert sorted(index[0]["files"]) == ["graph.py", "prompt.py", "workflow.json", "workflow.png"]
    assert (first / "workflow.png").read_bytes().startswith(PNG)
    assert "HumanEval" in (first / "graph.py").read_text()
    # A found workflow is called what it is, not by the seed's name it kept through the edits.
    found = json.loads((first / "workflow.json").read_text())
    assert found["name"] == f"humaneval-{good.content_hash[:12]}"
    assert "iteration 4, episode it4-g0-e1" in found["description"]
    assert f"edited from '{good.name}' ({good.description.rstrip('.')})." in found["description"]
    assert f"'humaneval-{good.content_hash[:12]}'" in (first / "prompt.py").read_text()
    kept = json.loads((root / f"2-{seed.content_hash[:12]}" / "workflow.json").read_text())
    assert (kept["name"], kept.get("description", "")) == (seed.name, seed.description)
    assert index[2]["files"] == []
    picture = root / f"2-{seed.content_hash[:12]}" / "workflow.png"
    drawn = picture.stat().st_mtime_ns
    (picture.parent / "marker").write_text("the same folder")
    run.write_best(best[1:], benchmark="humaneval")  # ranks moved: stale folders go
    names = sorted(p.name for p in root.iterdir() if p.is_dir())
    assert names == [f"1-{seed.content_hash[:12]}", f"2-{'f' * 12}"]
    moved = root / f"1-{seed.content_hash[:12]}"
    assert (moved / "marker").is_file()  # moved to its new rank...
    assert (moved / "workflow.png").stat().st_mtime_ns == drawn  # ...not drawn again
    index = json.loads((root / "index.json").read_text())
    assert index[0]["dir"] == f"best/1-{seed.content_hash[:12]}" and index[1]["files"] == []


def test_each_benchmark_of_several_gets_its_own_best_folder(tmp_path):
    run = RunDirectory(tmp_path)
    math_seed, code_seed = library.load("seed", "math"), library.load("seed", "code")
    for name, graph in (("gsm8k", math_seed), ("math", math_seed), ("mbpp", code_seed)):
        kept = [BestWorkflow(graph.content_hash, 0.5, 0, "seed", graph.to_json())]
        root = run.write_best(kept, benchmark=name, subdir=f"best/{name}")
        index = json.loads((root / "index.json").read_text())
        assert index[0]["dir"] == f"best/{name}/1-{graph.content_hash[:12]}"
    assert sorted(p.name for p in (tmp_path / "best").iterdir()) == ["gsm8k", "math", "mbpp"]
    graph_py = tmp_path / "best" / "mbpp" / f"1-{code_seed.content_hash[:12]}" / "graph.py"
    assert "MBPP" in graph_py.read_text()  # exported for the benchmark it was found on


def test_summary_line_shows_reward_best_validity_and_phase_seconds():
    line = summary_line(_record(3))
    assert line.startswith("return +0.030  best 0.830  valid 88%")
    assert "gen 1.2s" in line and "env 8.0s" in line and "train 0.5s" in line
    assert "ckpt" not in line  # phases that took no time are left out


def test_progress_bar_on_a_terminal_and_log_lines_elsewhere(caplog):
    stream = io.StringIO()
    with Progress(5, enabled=True, stream=stream) as bar:
        bar.phase(0, "step 1/4")
        bar.iteration_done(_record(0))
    assert "1/5" in stream.getvalue() and "return +0.000" in stream.getvalue()
    quiet = io.StringIO()
    with caplog.at_level(logging.INFO), Progress(5, stream=quiet) as plain:
        plain.iteration_done(_record(1))
    assert quiet.getvalue() == ""  # not a terminal: no bar...
    assert "iteration 2/5: return +0.010" in caplog.text  # ...a log line
    echoed = io.StringIO()
    with Progress(5, stream=echoed, echo=True) as local:  # a local run logs to a file
        local.iteration_done(_record(1))
        local.write("evaluating")
    lines = echoed.getvalue().splitlines()
    assert lines[0].startswith("iteration 2/5: return +0.010") and lines[1] == "evaluating"


async def test_timeline_counts_overlapping_calls_once():
    now = [0.0]
    timeline = Timeline(clock=lambda: now[0])
    with timeline.phase("step"):
        async with timeline.call():  # a call from 0 to 0.2 s ...
            async with timeline.call():  # ... and one from 0 to 0.1 s
                now[0] = 0.1
            now[0] = 0.2
    now[0] = 0.3  # the trainer's own work
    timeline.finish()
    record = timeline.record()
    assert record["time/step"] == pytest.approx(0.2)
    assert record["time/service_calls"] == pytest.approx(0.2)
    assert record["time/overhead_ratio"] == pytest.approx(0.1 / 0.3)
    with pytest.raises(ValueError, match="unknown phase"), timeline.phase("nap"):
        pass


async def test_timeline_phases_are_unions_of_their_overlapping_blocks():
    """Episodes move independently: one episode's step overlaps another's, and generation
    overlaps both; each phase counts the wall time during which one of its blocks ran."""
    now = [0.0]
    timeline = Timeline(clock=lambda: now[0])
    first_step = timeline.phase("step")
    first_step.__enter__()  # an episode steps from 0 to 0.4 s
    now[0] = 0.1
    with timeline.phase("generate"):  # another one's decision from 0.1 to 0.2 s
        now[0] = 0.2
    with timeline.phase("step"):  # its step from 0.2 to 0.3 s
        now[0] = 0.3
    now[0] = 0.4
    first_step.__exit__(None, None, None)
    now[0] = 0.5
    with timeline.phase("step"):  # a later step from 0.5 to 0.6 s
        now[0] = 0.6
    assert timeline.phases["step"] == pytest.approx(0.5)
    assert timeline.phases["generate"] == pytest.approx(0.1)
    with timeline.phase("step"):
        now[0] = 0.7
        assert timeline.record()["time/step"] == pytest.approx(0.6)  # an open block counts


def test_final_table_aligns_scores_and_unknown_costs():
    rows = [
        FinalRow("best (3fa2c1d9)", "3fa2", 0.912, 0.01, 131, 0.95, 1310, 12, 0.0123, 5.0),
        FinalRow("seed", "aaaa", 0.851, 0.004, 131, None, 131, 0, None, 1.0),
    ]
    table = final_table(rows, benchmark="humaneval")
    lines = table.splitlines()
    assert lines[0].startswith("Best workflow vs the seed and classic baselines on humaneval")
    assert "0.912 ± 0.010" in lines[4] and "0.0123" in lines[4] and "1,310" in lines[4]
    assert lines[5].endswith("unknown") and " - " in lines[5]
    assert len({len(line) for line in lines[2:4]}) == 1  # header and rule line up
    held = final_table(rows, benchmark="mbpp", held_out=True).splitlines()
    assert held[0].startswith("Held-out mbpp (never trained on)") and held[2:] == lines[2:]
