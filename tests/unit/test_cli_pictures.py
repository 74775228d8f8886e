"""``aflowrl plot`` (a run's curves, its search trees) and ``aflowrl show`` (a workflow file):
the pictures are written where asked and the path printed; a missing or malformed file is one
line naming it, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

from aflowrl.cli import main
from aflowrl.trainer import trees
from aflowrl.trainer.records import RunDirectory
from aflowrl.trainer.rows import Decision, Episode, StepRow
from aflowrl.workflow import library

PNG = b"\x89PNG\r\n\x1a\n"


def _run_dir(tmp_path):
    run = RunDirectory(tmp_path / "run")
    for i in range(3):
        run.append_metrics(
            {
                "iteration": i,
                "charts/episode_return": 0.1 * i,
                "charts/best_score": 0.7 + 0.01 * i,
                "losses/kl": 0.01,
                "charts/clipfrac": 0.2,
            }
        )
        row = StepRow(
            0,
            0,
            0,
            "s" * 64,
            Decision("add Review after generate"),
            child_hash=f"{i}" * 64,
            child_score=0.7 + 0.01 * i,
            parent_score=0.7,
        )
        episode = Episode(0, 0, 1, f"e{i}", benchmark="gsm8k", seed_score=0.7, rows=[row])
        run.append_tree(trees.episode_tree(episode, iteration=i, root="s" * 64))
    return run.path


def test_plot_redraws_the_curves_and_prints_the_path(tmp_path, capsys):
    run_dir = _run_dir(tmp_path)
    assert main(["plot", str(run_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(run_dir / "curves.png")
    assert (run_dir / "curves.png").read_bytes().startswith(PNG)
    out = tmp_path / "elsewhere" / "c.png"
    assert main(["plot", str(run_dir), "--out", str(out)]) == 0
    assert out.read_bytes().startswith(PNG) and capsys.readouterr().out.strip() == str(out)


def test_plot_tree_draws_the_last_or_the_asked_iteration(tmp_path, capsys):
    run_dir = _run_dir(tmp_path)
    assert main(["plot", str(run_dir), "--tree"]) == 0
    assert capsys.readouterr().out.strip() == str(run_dir / "tree-2.png")
    assert (run_dir / "tree-2.png").read_bytes().startswith(PNG)
    assert main(["plot", str(run_dir), "--tree", "--iteration", "1"]) == 0
    assert (run_dir / "tree-1.png").stat().st_size > 1000
    assert main(["plot", str(run_dir), "--tree", "--iteration", "9"]) == 2
    assert "no tree of iteration 9" in capsys.readouterr().err


def test_plot_errors_name_the_file(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "nope")]) == 2
    assert f"{tmp_path / 'nope'}: no such run directory" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["plot", str(empty)]) == 2
    assert f"{empty / 'metrics.jsonl'}: no such file" in capsys.readouterr().err
    assert main(["plot", str(empty), "--tree"]) == 2
    assert f"{empty / 'trees.jsonl'}: no such file" in capsys.readouterr().err
    (empty / "metrics.jsonl").write_text('{"iteration": 0}\nnot json\n{"iteration": 2}\n')
    assert main(["plot", str(empty)]) == 2
    assert f"{empty / 'metrics.jsonl'}:2: not JSON" in capsys.readouterr().err
    (empty / "metrics.jsonl").write_text('{"iteration": 0}\n{"iteration": 1, "charts/')
    assert main(["plot", str(empty)]) == 0  # a torn last line: a run writing it
    (empty / "trees.jsonl").write_text(json.dumps({"iteration": 0, "nodes": []}) + "\n")
    assert main(["plot", str(empty), "--tree"]) == 2
    assert f"{empty / 'trees.jsonl'}: not a search-tree record" in capsys.readouterr().err


def test_show_prints_the_workflow_and_draws_it(tmp_path, capsys):
    path = tmp_path / "workflow.json"
    path.write_text(library.load("cot_sc", "math").to_json())
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ScEnsemble" in out and out.strip().endswith(f"picture: {tmp_path / 'workflow.png'}")
    assert (tmp_path / "workflow.png").read_bytes().startswith(PNG)
    assert main(["show", str(path), "--out", str(tmp_path / "x" / "w.png")]) == 0
    assert (tmp_path / "x" / "w.png").read_bytes().startswith(PNG)


def test_show_errors_name_the_file_without_a_traceback(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"nodes": 3}')
    torn = tmp_path / "torn.json"
    torn.write_text('{"nodes": ')
    for path in (bad, torn, tmp_path / "missing.json"):
        done = subprocess.run(
            [sys.executable, "-m", "aflowrl", "show", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        assert str(path) in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
