"""Executor calls the evaluation cache, node reuse, dedupe and racing save over 20-round searches.

For each scenario it prints the executor calls the search *requested* (every evaluation asked
for, each child and duplicate evaluated in full, as a search with neither cache nor dedupe would)
and the calls it *made*, their ratio (made / requested; lower is better) and the best validation
score the search reached:

1. one search of R rounds with the random proposer (the requested count and every workflow's
   score are checked here against a baseline that re-evaluates every requested workflow cold,
   in the same process);
2. the same search without node reuse (whole-run cache and dedupe only: the behaviour before
   node reuse), which must reach the same scores, workflow by workflow;
3. a GiGPO group: N episodes of R rounds on the same task and seed sharing one evaluator, as the
   environment service runs them (its cache shares runs and node draws across trajectories);
4. the single search interrupted in the middle of an evaluation (after half its calls) and
   resumed in a fresh evaluator with the same SQLite cache, as ``aflowrl optimize`` resumes from
   its run directory: made counts both parts.

Then racing (``evaluation.racing``; it needs selection ucb or fused, so these searches use ucb):
the single search and the group, each with and without racing from the same seeds, with the
calls made, the calls racing saved, the best scores reached and how many children were raced out.

The executor is the calibrated surrogate in-process when it is installed, else the
deterministic OpenAI-compatible test server on loopback (``--executor oracle``).

    .venv/bin/python bench/search_cache.py [--benchmark gsm8k] [--rounds 20] [--group 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from aflowrl.benchmarks import get_benchmark  # noqa: E402
from aflowrl.benchmarks.base import Problem  # noqa: E402
from aflowrl.config import SearchSpec  # noqa: E402
from aflowrl.config.environment import EvaluationSpec, RacingSpec  # noqa: E402
from aflowrl.executor.base import Executor  # noqa: E402
from aflowrl.search import EpisodeState, SearchContext, graph_at  # noqa: E402
from aflowrl.search.optimize import run_search  # noqa: E402
from aflowrl.search.proposers import RandomProposer  # noqa: E402
from aflowrl.search.rundir import RunDirectory  # noqa: E402
from aflowrl.workflow import EvaluationCache, EvaluationSettings, Evaluator  # noqa: E402


def requested_calls(state: EpisodeState) -> int:
    """Calls a search without cache or dedupe would make: the seed plus every valid step's child."""
    calls = state.nodes[0].calls
    for attempt in state.attempts:
        if attempt.valid and attempt.child is not None:
            calls += state.nodes[attempt.child].calls
    return calls


class _Interrupted(Exception):
    pass


class CountingExecutor:
    """Counts the calls that reach the executor; raises :class:`_Interrupted` at ``stop_at``."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.calls = 0
        self.stop_at: int | None = None

    @property
    def executor_id(self) -> str:
        return self.inner.executor_id

    async def chat(self, messages: Any, **options: Any) -> Any:
        if self.stop_at is not None and self.calls >= self.stop_at:
            raise _Interrupted
        self.calls += 1
        return await self.inner.chat(messages, **options)

    async def aclose(self) -> None:
        return None


async def _executor(kind: str, problems: Sequence[Problem], stack: AsyncExitStack) -> Executor:
    if kind == "surrogate":
        from aflowrl.executor.surrogate import SurrogateExecutor

        return SurrogateExecutor(problems)
    from oracle_openai_server import OracleServer

    from aflowrl.executor.openai import OpenAIExecutor

    server = await stack.enter_async_context(OracleServer(problems, wrong_rate=0.4))
    executor = OpenAIExecutor(server.base_url, "oracle", max_concurrency=64)
    stack.push_async_callback(executor.aclose)
    return executor


async def main(args: argparse.Namespace) -> None:
    benchmark = get_benchmark(args.benchmark)
    validate = benchmark.load("validate", args.data_dir)
    spec = SearchSpec(max_steps=args.rounds, selection="aflow")  # AFlow's search, as today
    evaluation = EvaluationSpec(max_problems=args.problems)
    rows: list[tuple[str, int, int, float]] = []
    async with AsyncExitStack() as stack:
        executor = CountingExecutor(await _executor(args.executor, validate, stack))
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))

        def context(
            cache: EvaluationCache | None = None,
            *,
            reuse: bool = True,
            search: SearchSpec = spec,
            scoring: EvaluationSpec = evaluation,
        ) -> SearchContext:
            settings = EvaluationSettings(reuse_nodes=reuse)
            evaluator = Evaluator(executor, benchmark, cache=cache, settings=settings)
            return SearchContext(evaluator, validate, search, scoring)

        async def search(ctx: SearchContext, name: str, proposer_seed: int) -> EpisodeState:
            return await run_search(
                ctx,
                RandomProposer(proposer_seed),
                RunDirectory(workdir / name),
                rounds=args.rounds,
                seed=args.seed,
            )

        async def group(name: str, shared: SearchContext) -> list[EpisodeState]:
            return [await search(shared, f"{name}-{e}", 1000 + e) for e in range(args.group)]

        started = time.perf_counter()
        state = await search(context(), "single", args.seed)
        single_s = time.perf_counter() - started
        requested, made = requested_calls(state), executor.calls
        executor.calls = 0
        baseline = await _uncached_baseline(executor, benchmark, validate, state, evaluation)
        if baseline != requested or executor.calls != requested:
            raise SystemExit(f"requested {requested} but the uncached baseline made {baseline}")
        rows.append((f"one search, {args.rounds} rounds", requested, made, state.best_score))

        executor.calls = 0
        plain = await search(context(reuse=False), "single-no-reuse", args.seed)
        if [(n.hash, n.score) for n in plain.nodes] != [(n.hash, n.score) for n in state.nodes]:
            raise SystemExit("without node reuse the search reached other workflows or scores")
        rows.append(
            ("  the same, no node reuse", requested_calls(plain), executor.calls, plain.best_score)
        )

        executor.calls = 0
        states = await group("group", context())
        rows.append(
            (
                f"group of {args.group} x {args.rounds} rounds",
                sum(map(requested_calls, states)),
                executor.calls,
                max(s.best_score for s in states),
            )
        )

        # Interrupted in the middle of an evaluation (half the calls made), then resumed.
        executor.calls = 0
        executor.stop_at = made // 2
        resume_dir = RunDirectory(workdir / "resumed")
        with EvaluationCache(resume_dir.cache_path) as cache, suppress(_Interrupted):
            await run_search(
                context(cache),
                RandomProposer(args.seed),
                resume_dir,
                rounds=args.rounds,
                seed=args.seed,
            )
        executor.stop_at = None
        interrupted_after = len(resume_dir.rounds()) - 1
        with EvaluationCache(resume_dir.cache_path) as cache:
            state = await run_search(
                context(cache),
                RandomProposer(args.seed),
                resume_dir,
                rounds=args.rounds,
                seed=args.seed,
            )
        rows.append(
            (
                f"interrupted in round {interrupted_after + 1}, resumed",
                requested_calls(state),
                executor.calls,
                state.best_score,
            )
        )

        ucb = SearchSpec(max_steps=args.rounds, selection="ucb")
        racing = EvaluationSpec(
            max_problems=args.problems, racing=RacingSpec(enabled=True, delta=args.delta)
        )
        runs: dict[bool, tuple[Run, Run]] = {}
        for raced in (False, True):
            scoring = racing if raced else evaluation
            executor.calls = 0
            single = await search(context(search=ucb, scoring=scoring), f"ucb-{raced}", args.seed)
            one = Run(executor.calls, [single])
            executor.calls = 0
            many = await group(f"ucb-group-{raced}", context(search=ucb, scoring=scoring))
            runs[raced] = (one, Run(executor.calls, many))
        races = [
            ("one search", runs[False][0], runs[True][0]),
            (f"group of {args.group}", runs[False][1], runs[True][1]),
        ]

    print(
        f"# {args.benchmark}, {args.problems} validation problems, random proposer, "
        f"executor {args.executor}; one search took {single_s:.1f} s"
    )
    print(f"{'scenario':36} {'requested':>10} {'made':>8} {'made/requested':>15} {'best':>6}")
    for name, requested, made, best in rows:
        print(f"{name:36} {requested:>10} {made:>8} {made / requested:>15.3f} {best:>6.3f}")
    print(
        f"\n# racing (selection ucb, delta {args.delta}, same seeds), {args.rounds} rounds:"
        " calls made, best validation score, children raced out / new children"
    )
    print(
        f"{'scenario':14} {'made':>7} {'raced':>7} {'raced/made':>11} "
        f"{'best':>6} {'raced':>6} {'raced out':>10}"
    )
    for name, full, fast in races:
        print(
            f"{name:14} {full.made:>7} {fast.made:>7} {fast.made / full.made:>11.3f} "
            f"{full.best:>6.3f} {fast.best:>6.3f} {fast.raced_out:>10}"
        )


@dataclass(frozen=True)
class Run:
    """Calls made by searches and what they reached."""

    made: int
    states: list[EpisodeState]

    @property
    def best(self) -> float:
        return max(s.best_score for s in self.states)

    @property
    def raced_out(self) -> str:
        new = [n for s in self.states for n in s.nodes[1:]]
        return f"{sum(1 for n in new if n.raced)}/{len(new)}"


async def _uncached_baseline(
    executor: CountingExecutor,
    benchmark: Any,
    problems: Sequence[Problem],
    state: EpisodeState,
    evaluation: EvaluationSpec,
) -> int:
    """Re-evaluate every requested workflow with an empty cache; the calls it makes.

    Each cold score must be the one the search recorded for that workflow (node reuse and the
    caches change what is paid, never what is scored)."""
    from aflowrl.workflow import subset

    chosen = subset(problems, evaluation.max_problems, state.seed)
    indices = [0] + [a.child for a in state.attempts if a.valid and a.child is not None]
    calls = 0
    for index in indices:
        evaluator = Evaluator(
            executor,
            benchmark,
            cache=EvaluationCache(),
            settings=EvaluationSettings(reuse_nodes=False),
        )
        result = await evaluator.evaluate(graph_at(state, index), chosen, repeats=state.repeats)
        if result.score_mean != state.nodes[index].score:
            raise SystemExit(
                f"workflow {index} scored {state.nodes[index].score} in the search but "
                f"{result.score_mean} cold"
            )
        calls += result.executor_calls
    return calls


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--benchmark", default="gsm8k")
    parser.add_argument("--data-dir", default=os.environ.get("AFLOWRL_DATA_DIR"))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--problems", type=int, default=50, help="validation problems scored")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--delta", type=float, default=0.05, help="racing's error probability")
    parser.add_argument(
        "--executor",
        default="surrogate",
        choices=["surrogate", "oracle"],
        help="in-process surrogate (default) or the loopback test server",
    )
    options = parser.parse_args()
    if options.data_dir is None:  # a checkout beside a shared/datasets/aflow directory
        found = [p / "shared/datasets/aflow" for p in ROOT.parents]
        options.data_dir = next((str(p) for p in found if p.is_dir()), None)
    asyncio.run(main(options))
