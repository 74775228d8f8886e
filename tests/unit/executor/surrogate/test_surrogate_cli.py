"""``aflowrl surrogate serve`` and ``aflowrl surrogate calibrate`` with tiny settings."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request

from aflowrl.cli import main


async def _in_process_answer(problems, prompt: str) -> list[str]:
    from aflowrl.executor.surrogate import SurrogateExecutor

    completion = await SurrogateExecutor(problems).complete([prompt], n=2, seed=3)
    return list(completion.texts)


def test_serve_answers_openai_requests_until_sigterm(aflow_data, all_problems):
    question = next(p for p in all_problems if p.benchmark == "math").question
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aflowrl",
            "surrogate",
            "serve",
            "--port",
            "0",
            "--model",
            "surrogate",
            "--model",
            "gpt-4o-mini",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "AFLOWRL_DATA_DIR": str(aflow_data)},
    )
    try:
        assert process.stdout is not None
        base_url = json.loads(process.stdout.readline())["base_url"]
        with urllib.request.urlopen(f"{base_url}/models", timeout=30) as response:
            names = [card["id"] for card in json.load(response)["data"]]
        assert names == ["surrogate", "gpt-4o-mini"]
        body = {
            "model": "surrogate",
            "messages": [{"role": "user", "content": question}],
            "n": 2,
            "seed": 3,
        }
        request = urllib.request.Request(
            f"{base_url}/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.load(response)
        texts = [choice["message"]["content"] for choice in answer["choices"]]
        # Another process (another hash seed), the same answers as in-process.
        assert texts == asyncio.run(_in_process_answer(all_problems, question))
    finally:
        process.send_signal(signal.SIGTERM)
        _, errors = process.communicate(timeout=30)
    assert process.returncode == 0, errors


def test_calibrate_writes_measured_and_target_cells(aflow_data, tmp_path, capsys):
    out = tmp_path / "cells.json"
    code = main(
        [
            "surrogate",
            "calibrate",
            "--data-dir",
            str(aflow_data),
            "--benchmarks",
            "gsm8k,hotpotqa",
            "--workflows",
            "io,cot_sc",
            "--seeds",
            "0",
            "--limit",
            "8",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    rows = json.loads(out.read_text())
    assert [(r["benchmark"], r["workflow"]) for r in rows] == [
        ("gsm8k", "io"),
        ("gsm8k", "cot_sc"),
        ("hotpotqa", "io"),
        ("hotpotqa", "cot_sc"),
    ]
    assert all({"benchmark", "workflow", "measured", "target"} <= set(r) for r in rows)
    assert rows[0]["target"] == 92.7 and 0 <= rows[0]["measured"] <= 100
    assert rows[2]["split"] == "validate"  # HotpotQA has no test split
    printed = capsys.readouterr()
    assert "measured" in printed.out and "validate" in printed.err


def test_calibrate_rejects_bad_arguments(aflow_data, capsys):
    assert main(["surrogate", "calibrate", "--benchmarks", "chess"]) == 2
    assert "--benchmarks" in capsys.readouterr().err
    assert main(["surrogate", "calibrate", "--seeds", "a,b"]) == 2
    assert "--seeds" in capsys.readouterr().err


def test_eval_runs_workflows_on_the_in_process_surrogate(aflow_data, tmp_path, capsys):
    out = tmp_path / "eval.json"
    code = main(
        [
            "eval",
            "--workflow",
            "io,cot",
            "--benchmark",
            "drop",
            "--executor",
            "surrogate",
            "--data-dir",
            str(aflow_data),
            "--limit",
            "6",
            "--no-progress",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["executor"]["executor_id"].startswith("surrogate:gpt-4o-mini@")
    assert [r["workflow"] for r in doc["results"]] == ["io", "cot"]
    assert all(r["cost_usd"] == 0.0 for r in doc["results"])
    assert "score %" in capsys.readouterr().out
