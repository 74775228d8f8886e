"""``aflowrl eval``: evaluate library or saved workflows on a benchmark split with an executor.

Prints a progress bar while it runs, then a table (score mean and standard deviation over the
repeats, cost, tokens, latency, executor calls, cache hits), and writes the full results as JSON
with ``--json``. With ``--cache FILE`` results are kept in SQLite, so running the same command
again costs nothing.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aflowrl.benchmarks.base import Benchmark, Problem
    from aflowrl.workflow import EvaluationResult, Graph

NAME = "eval"
HELP = "Evaluate workflows (library names or JSON files) on a benchmark split."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workflow",
        required=True,
        help="library workflow names (seed, io, cot, cot_sc, medprompt, self_refine) or JSON "
        "files, comma-separated",
    )
    parser.add_argument(
        "--benchmark", required=True, help="gsm8k, math, humaneval, mbpp, hotpotqa or drop"
    )
    parser.add_argument("--split", default="test", choices=["validate", "test"])
    parser.add_argument(
        "--executor",
        required=True,
        metavar="URL",
        help="OpenAI-compatible endpoint, e.g. "
        "http://localhost:8000/v1 (API key from $AFLOWRL_EXECUTOR_API_KEY[_FILE]), or "
        "'surrogate' for the offline surrogate executor, in-process",
    )
    parser.add_argument(
        "--model",
        help="model name sent to the endpoint (default: the one model it serves, when it "
        "serves exactly one; required otherwise)",
    )
    parser.add_argument(
        "--data-dir",
        help="directory of the benchmark split files (default: $AFLOWRL_DATA_DIR, else "
        "$AFLOWRL_CACHE_DIR/data, where 'aflowrl data download' puts them)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs of each problem")
    parser.add_argument("--problems", help="only these problem ids, comma-separated")
    parser.add_argument("--limit", type=int, help="only the first N problems")
    parser.add_argument("--concurrency", type=int, default=16, help="problem runs at once")
    parser.add_argument(
        "--max-concurrency", type=int, default=32, help="executor requests in flight"
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds per problem run (over it scores 0)"
    )
    parser.add_argument("--temperature", type=float, help="executor sampling temperature")
    parser.add_argument("--max-tokens", type=int, help="most completion tokens per call")
    parser.add_argument("--seed", type=int, default=0, help="base seed of every run")
    parser.add_argument("--cache", metavar="FILE", help="SQLite evaluation cache")
    parser.add_argument("--json", metavar="OUT", help="write the results as JSON here")
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (there is none either when stderr is no terminal)",
    )


def run(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import sys
    from pathlib import Path

    from aflowrl.benchmarks import get_benchmark
    from aflowrl.errors import InvalidInputError
    from aflowrl.workflow import library, select_problems

    for name in ("repeats", "concurrency", "max_concurrency"):
        if getattr(args, name) < 1:
            raise InvalidInputError("must be at least 1", field=f"--{name.replace('_', '-')}")
    if args.limit is not None and args.limit < 1:
        raise InvalidInputError("must be at least 1", field="--limit")
    if args.timeout <= 0:
        raise InvalidInputError("must be positive", field="--timeout")

    benchmark = get_benchmark(args.benchmark)
    graphs = [
        library.resolve(spec.strip(), benchmark.task_type)
        for spec in args.workflow.split(",")
        if spec.strip()
    ]
    problems = select_problems(
        benchmark.load(args.split, args.data_dir),
        [p.strip() for p in args.problems.split(",")] if args.problems else None,
        args.limit,
    )
    results, executor_id = asyncio.run(_evaluate(args, benchmark, graphs, problems))

    print(_table(results))
    if args.json:
        doc = {
            "benchmark": benchmark.name,
            "split": args.split,
            "executor": {
                "base_url": args.executor,
                "model": args.model,
                "executor_id": executor_id,
            },
            "settings": {
                "repeats": args.repeats,
                "seed": args.seed,
                "temperature": args.temperature,
                "max_tokens": args.max_tokens,
                "timeout_s": args.timeout,
            },
            "results": [r.to_dict() for r in results],
        }
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {out}", file=sys.stderr)
    return 0


async def _evaluate(
    args: argparse.Namespace,
    benchmark: Benchmark,
    graphs: Sequence[Graph],
    problems: Sequence[Problem],
) -> tuple[list[EvaluationResult], str]:
    """Every workflow on every problem, one progress bar; returns results and executor id."""

    from aflowrl.common.progress import progress_bar
    from aflowrl.executor.base import Executor
    from aflowrl.executor.openai import OpenAIExecutor
    from aflowrl.workflow import (
        EvaluationCache,
        EvaluationSettings,
        Evaluator,
        RunSettings,
        SampleResult,
    )

    settings = EvaluationSettings(
        repeats=args.repeats,
        concurrency=args.concurrency,
        problem_timeout_s=args.timeout,
        seed=args.seed,
        run=RunSettings(temperature=args.temperature, max_tokens=args.max_tokens),
    )
    executor: Executor
    if args.executor == "surrogate":
        from aflowrl.executor.surrogate import SurrogateExecutor

        executor = SurrogateExecutor(data_dir=args.data_dir)
    else:
        from aflowrl.cli._io import executor_model

        args.model = await executor_model(args.executor, args.model)
        executor = OpenAIExecutor(args.executor, args.model, max_concurrency=args.max_concurrency)
    total = len(graphs) * len(problems) * args.repeats
    bar = progress_bar(total, unit="run", enabled=False if args.no_progress else None)
    scores: list[float] = []

    def progress(sample: SampleResult) -> None:
        scores.append(sample.score)
        bar.update(1)
        bar.set_postfix(score=f"{100 * sum(scores) / len(scores):.1f}", refresh=False)

    results = []
    try:
        with EvaluationCache(args.cache) as cache:
            evaluator = Evaluator(
                executor,
                benchmark,
                settings=settings,
                cache=cache,
            )
            for graph in graphs:
                bar.set_description(graph.name)
                scores.clear()
                results.append(await evaluator.evaluate(graph, problems, progress=progress))
    finally:
        bar.close()
        await executor.aclose()
    return results, executor.executor_id


def _table(results: Sequence[EvaluationResult]) -> str:
    """A plain-text table, one row per workflow."""
    header = [
        "workflow",
        "score %",
        "+- std",
        "problems",
        "cost $",
        "tokens",
        "latency s",
        "calls",
        "cached",
        "failed",
    ]
    rows = []
    for result in results:
        samples = result.samples
        cost = result.cost_usd
        rows.append(
            [
                result.workflow,
                f"{100 * result.score_mean:.2f}",
                f"{100 * result.score_std:.2f}",
                f"{len(result.problems)}x{result.repeats}",
                "unknown" if cost is None else f"{cost:.4f}",
                str(sum(s.prompt_tokens + s.completion_tokens for s in samples)),
                f"{sum(s.latency_s for s in samples) / len(samples):.3g}",
                str(result.executor_calls),
                str(result.cache_hits),
                str(result.failures),
            ]
        )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])
