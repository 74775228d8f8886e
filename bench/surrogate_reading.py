"""How the surrogate scores prompts by what they ask: the held-out instructions, per category.

Puts every instruction of ``tests/integration/surrogate/heldout_instructions.json`` in the
instruction slot (:func:`aflowrl.cli.surrogate_calibration.instruction_slot`) and scores it on
each benchmark's test split (HotpotQA: validation), seed 0, next to the references the
held-out test uses: IO (the library's), the slot with no instruction, the slot with the CoT
instruction (math and code: the library's CoT) and the slot with an answer-only instruction.
Prints, per category and benchmark, the number of instructions, the mean score, its lowest
and highest, and the mean difference to IO and to CoT; ``--json OUT`` writes every score.

    .venv/bin/python bench/surrogate_reading.py [--data-dir DIR] [--benchmarks gsm8k,math]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
from collections.abc import Awaitable
from pathlib import Path

from aflowrl.benchmarks import get_benchmark
from aflowrl.benchmarks.base import Benchmark, Problem
from aflowrl.cli import surrogate_calibration as fitting
from aflowrl.executor.surrogate import SurrogateExecutor, load_problems
from aflowrl.workflow import Graph, library

ROOT = Path(__file__).resolve().parents[1]
HELDOUT = ROOT / "tests/integration/surrogate/heldout_instructions.json"
ANSWER_ONLY = "Give only the final answer, with no explanation."


async def _score(
    executor: SurrogateExecutor, scorer: Benchmark, graph: Graph, problems: list[Problem]
) -> float:
    found = await fitting.evaluate_graph(executor, scorer, graph, problems, seeds=(0,))
    return found[0]


async def main(data_dir: str | None, benchmarks: list[str]) -> list[dict[str, object]]:
    items = json.loads(HELDOUT.read_text())["instructions"]
    executor = SurrogateExecutor(load_problems(data_dir))
    rows: list[dict[str, object]] = []
    header = f"{'category/band':<36} {'benchmark':<10} {'n':>3} {'mean':>6} {'min':>6} {'max':>6}"
    print(f"{header} {'vs IO':>7} {'vs CoT':>7}")
    for name in benchmarks:
        benchmark = get_benchmark(name)
        task = benchmark.task_type
        problems = benchmark.load(fitting.split_for(name, "test"), data_dir)
        scorer = fitting.MemoizedScorer(benchmark)

        def score(
            graph: Graph, scorer: Benchmark = scorer, problems: list = problems
        ) -> Awaitable[float]:
            return _score(executor, scorer, graph, problems)

        cot_text = (
            "Think step by step."
            if task == "qa"
            else str(next(iter(library.load("cot", task).to_dict()["prompts"].values())))
        )
        refs = {
            "io": await score(library.load("io", task)),
            "cot": await score(library.load("cot", task)),
            "slot_io": await score(fitting.instruction_slot(task, None)),
            "slot_cot": await score(fitting.instruction_slot(task, cot_text)),
            "slot_answer_only": await score(fitting.instruction_slot(task, ANSWER_ONLY)),
        }
        print(f"# {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in refs.items()))
        by_category: dict[str, list[float]] = {}
        for item in items:
            value = await score(fitting.instruction_slot(task, item["instruction"]))
            by_category.setdefault(f"{item['category']}/{item['expect']}", []).append(value)
            rows.append({"benchmark": name, **item, "score": round(value, 2), **refs})
        for category, values in sorted(by_category.items()):
            mean = statistics.fmean(values)
            print(
                f"{category:<36} {name:<10} {len(values):>3} {mean:>6.1f} {min(values):>6.1f} "
                f"{max(values):>6.1f} {mean - refs['io']:>+7.1f} {mean - refs['slot_cot']:>+7.1f}"
            )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("AFLOWRL_DATA_DIR"))
    parser.add_argument("--benchmarks", default=",".join(fitting.BENCHMARKS))
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args()
    scored = asyncio.run(main(args.data_dir, args.benchmarks.split(",")))
    if args.json:
        Path(args.json).write_text(json.dumps(scored, indent=1) + "\n")
