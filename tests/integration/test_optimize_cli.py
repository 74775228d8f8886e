"""``aflowrl optimize`` end to end over HTTP: the search, its run directory, resuming, proposers.

The executor is the deterministic OpenAI-compatible oracle server (``oracle_openai_server.py``)
on loopback, wrong on a share of (problem, seed) pairs, so ensembles and review loops pay off;
the benchmark is GSM8K from small split files written here (real loader, scorer, HTTP client,
evaluator and cache). The ``llm`` proposer talks to a second loopback server that replies with
scripted actions.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from aflowrl.benchmarks import get_benchmark
from aflowrl.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from oracle_openai_server import OracleServer


def _write_split(directory: Path, split: str, start: int, count: int) -> None:
    lines = [
        json.dumps(
            {
                "id": f"{split}-{i}",
                "question": f"Ann has {i} apples and buys {2 * i + 3} more. How many apples now?",
                "answer": str(3 * i + 3),
            }
        )
        for i in range(start, start + count)
    ]
    (directory / f"gsm8k_{split}.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "data"
    directory.mkdir()
    _write_split(directory, "validate", 0, 10)
    _write_split(directory, "test", 100, 10)
    return directory


@contextmanager
def serving(app_server: Any) -> Iterator[Any]:
    """Run an ``async with``-style server on its own event loop in a thread."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(app_server.__aenter__())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(app_server.__aexit__(None, None, None))
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(30)
    try:
        yield app_server
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)


@pytest.fixture
def oracle(data_dir: Path) -> Iterator[OracleServer]:
    benchmark = get_benchmark("gsm8k")
    problems = benchmark.load("validate", data_dir) + benchmark.load("test", data_dir)
    with serving(OracleServer(problems, wrong_rate=0.45)) as server:
        yield server


def _argv(oracle: OracleServer, data_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        "optimize",
        "--benchmark",
        "gsm8k",
        "--executor",
        oracle.base_url,
        "--model",
        "oracle",
        "--data-dir",
        str(data_dir),
        "--run-dir",
        str(run_dir),
        "--no-progress",
        *extra,
    ]


def test_optimize_writes_its_run_directory_and_resumes(oracle, data_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(_argv(oracle, data_dir, run_dir, "--rounds", "6", "--seed", "3")) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["workflow", "validation", "%"]
    labels = [line.split()[0] for line in lines[2:]]
    assert labels == ["best", "seed", "io", "cot", "cot_sc", "medprompt", "self_refine"]
    assert "best validation score" in err
    for name in (
        "run.json",
        "state.json",
        "rounds.jsonl",
        "tree.json",
        "final.json",
        "final.txt",
        "cache.sqlite",
        "best/workflow.json",
        "best/graph.py",
        "best/prompt.py",
        "best/workflow.png",
    ):
        assert (run_dir / name).is_file(), name
    rounds = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == list(range(7))
    new = [r for r in rounds[1:] if r["valid"] and not r["duplicate"]]
    assert all((run_dir / "rounds" / f"round_{r['round']}.json").is_file() for r in new)
    tree = json.loads((run_dir / "tree.json").read_text())
    assert tree["best_score"] >= tree["seed_score"] and tree["rounds"] == 6
    # The best workflow's files call it what it is: the seed's name only for the seed itself.
    nodes = json.loads((run_dir / "state.json").read_text())["nodes"]
    node = max(nodes, key=lambda n: n["score"])  # the best (ties: the earliest)
    best = json.loads((run_dir / "best/workflow.json").read_text())
    if node.get("action") is None:
        assert best["name"] == "seed"
    else:
        assert best["name"] == f"gsm8k-{node['hash'][:12]}"
        assert node["action"] in best["description"] and "edited from 'seed'" in best["description"]
        assert f"Workflow 'gsm8k-{node['hash'][:12]}'" in (run_dir / "best/graph.py").read_text()
    final = json.loads((run_dir / "final.json").read_text())
    assert final["split"] == "test" and final["problems"] == 10
    assert {r["workflow"] for r in final["rows"]} >= {"seed", "cot_sc", "self_refine"}

    # The same command with more rounds resumes: the first six rounds are not redone.
    requests = oracle.requests
    assert main(_argv(oracle, data_dir, run_dir, "--rounds", "8", "--seed", "3")) == 0
    _, err = capsys.readouterr()
    assert "resuming" in err
    rounds = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == list(range(9))
    made = sum(r["executor_calls"] for r in rounds[7:])
    # The final table comes from the cache, so only the two new rounds called the executor.
    assert oracle.requests - requests == made

    # Another seed in the same directory is refused, naming the setting.
    assert main(_argv(oracle, data_dir, run_dir, "--rounds", "8", "--seed", "4")) == 2
    assert "seed" in capsys.readouterr().err


def test_bad_input_fails_before_any_work(oracle, data_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    cases = [
        (["--rounds", "0"], "--rounds"),
        (["--selection", "fused", "--value-source", "policy"], "--value-source"),
        (["--proposer", "llm"], "--proposer-url"),
        (["--proposer", "policy"], "--policy"),
        (["--proposer", "random", "--action-mode", "freeform"], "--action-mode"),
        (["--max-problems", "0"], "max_problems"),
    ]
    for extra, field in cases:
        assert main(_argv(oracle, data_dir, run_dir, *extra)) == 2, extra
        assert field in capsys.readouterr().err
    assert main([*_argv(oracle, tmp_path / "nowhere", run_dir)]) == 2
    assert oracle.requests == 0 and not (run_dir / "state.json").exists()


class ScriptedChatServer(OracleServer):
    """The test server's HTTP side, answering from a list of replies (the llm proposer)."""

    def __init__(self, replies: list[str]) -> None:
        super().__init__([], model="proposer")
        self.replies = replies
        self.prompts: list[str] = []

    def reply(self, prompt: str, seed: int | None) -> str:
        self.prompts.append(prompt)
        return self.replies.pop(0) if self.replies else "<action>nothing left</action>"


def test_llm_proposer_over_http(oracle, data_dir, tmp_path, capsys):
    replies = [
        "Let me think. An ensemble.",  # unusable: asked again
        "<think>Self-consistency helps.</think><action>add ScEnsemble after generate</action>",
        "<action>wrap ensemble in review_revise</action>",
    ]
    with serving(ScriptedChatServer(replies)) as chat:
        argv = _argv(oracle, data_dir, tmp_path / "run", "--rounds", "2", "--proposer", "llm")
        argv += ["--proposer-url", chat.base_url, "--selection", "ucb", "--no-final"]
        assert main(argv) == 0
        assert len(chat.prompts) == 3 and "no <action>" in chat.prompts[1]
    capsys.readouterr()
    rounds = [json.loads(x) for x in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert rounds[1]["action"] == "add ScEnsemble after generate samples=5"
    assert rounds[1]["proposer_attempts"] == 2 and rounds[2]["valid"]
    assert rounds[2]["action"] == "wrap ensemble in review_revise"


def test_policy_proposer_from_the_command_line(oracle, data_dir, tmp_path, capsys):
    pytest.importorskip("torch")
    argv = _argv(oracle, data_dir, tmp_path / "run", "--rounds", "1", "--proposer", "policy")
    assert main([*argv, "--policy", "tiny", "--no-final"]) == 0
    capsys.readouterr()
    rounds = [json.loads(x) for x in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert len(rounds) == 2 and all(r["valid"] for r in rounds)


def test_optimize_with_the_surrogate_executor(aflow_data, tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["optimize", "--benchmark", "gsm8k", "--executor", "surrogate", "--rounds", "4"]
    argv += ["--data-dir", str(aflow_data), "--run-dir", str(run_dir), "--max-problems", "40"]
    assert main([*argv, "--no-progress", "--no-final"]) == 0
    capsys.readouterr()
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["executor"].startswith("surrogate:")
    tree = json.loads((run_dir / "tree.json").read_text())
    assert tree["rounds"] == 4 and tree["best_score"] >= tree["seed_score"] > 0
