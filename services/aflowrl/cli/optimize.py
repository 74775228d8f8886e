"""``aflowrl optimize``: AFlow's workflow search on a benchmark, with a proposer, resumably.

Runs ``--rounds`` rounds of the tree search (:mod:`aflowrl.search`) from the benchmark's seed
workflow: each round a proposer (``random``, ``llm`` on an OpenAI-compatible endpoint, or a
local ``policy`` checkpoint) proposes one edit of a selected workflow, which is evaluated on the
validation split with the executor. A progress bar shows the rounds; the run directory holds the
tree, every round, the best workflow (JSON, AFlow code, picture) and the final table: the best
workflow, the seed and the classic baselines on the test split (benchmarks without a test split,
such as HotpotQA here, hold out half of the validation problems instead, chosen by the seed).
Running the same command again resumes the run from its directory.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aflowrl.benchmarks.base import Problem
    from aflowrl.config import SearchSpec
    from aflowrl.config.environment import EvaluationSpec
    from aflowrl.executor.base import Executor
    from aflowrl.search.proposers import Proposer

NAME = "optimize"
HELP = "Search for a better workflow on a benchmark (AFlow's loop, with a proposer)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--benchmark", required=True, help="gsm8k, math, humaneval, mbpp, hotpotqa or drop"
    )
    parser.add_argument("--rounds", type=int, default=20, help="edits to make (default 20)")
    parser.add_argument(
        "--proposer",
        default="random",
        choices=["random", "llm", "policy"],
        help="who proposes each edit (default random)",
    )
    parser.add_argument(
        "--executor",
        required=True,
        metavar="URL|surrogate",
        help="the executor LLM: an OpenAI-compatible endpoint (API key from "
        "$AFLOWRL_EXECUTOR_API_KEY[_FILE]) or 'surrogate' (the offline stand-in, in-process)",
    )
    parser.add_argument(
        "--model",
        help="executor model name (default: the one model the endpoint serves, when it serves "
        "exactly one; required otherwise)",
    )
    parser.add_argument(
        "--data-dir",
        help="directory of the benchmark split files (default: $AFLOWRL_DATA_DIR, else "
        "$AFLOWRL_CACHE_DIR/data, where 'aflowrl data download' puts them)",
    )
    parser.add_argument(
        "--run-dir", help="run directory (default runs/optimize-<benchmark>-<proposer>-s<seed>)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the search and proposer")
    from aflowrl.cli._help import add_file_argument

    add_file_argument(parser, "take search and evaluation settings from a RunSpec file")
    parser.add_argument("--selection", choices=["aflow", "ucb", "fused"], help="parent selection")
    parser.add_argument(
        "--value-source",
        choices=["policy", "anchor-mc"],
        help="values for fused selection: the policy's own (--proposer policy) or the mean "
        "observed return per workflow (default: policy with --proposer policy, else anchor-mc)",
    )
    parser.add_argument(
        "--action-mode",
        choices=["choice", "text", "freeform"],
        help="how the proposer acts (default: choice; text for llm)",
    )
    parser.add_argument("--repeats", type=int, help="runs of each problem per evaluation")
    parser.add_argument("--max-problems", type=int, help="score on a subset of this many")
    parser.add_argument(
        "--convergence-rounds", type=int, help="stop when the top-k mean is unchanged this long"
    )
    parser.add_argument("--concurrency", type=int, help="problem runs at once")
    parser.add_argument(
        "--max-concurrency", type=int, default=32, help="executor requests in flight"
    )
    parser.add_argument("--timeout", type=float, help="seconds per problem run")
    parser.add_argument("--temperature", type=float, help="executor sampling temperature")
    parser.add_argument("--max-tokens", type=int, help="most completion tokens per call")
    parser.add_argument("--proposer-url", help="OpenAI-compatible endpoint of the llm proposer")
    parser.add_argument(
        "--proposer-model",
        help="model of the llm proposer (default: the one model --proposer-url serves, when it "
        "serves exactly one; required otherwise)",
    )
    parser.add_argument(
        "--proposer-retries", type=int, default=2, help="asks again after unusable replies"
    )
    parser.add_argument("--policy", metavar="DIR", help="local Hugging Face checkpoint (policy)")
    parser.add_argument(
        "--no-final", action="store_true", help="skip the test-split table at the end"
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (there is none either when stderr is no terminal)",
    )


def _settings(args: argparse.Namespace) -> tuple[str, SearchSpec, EvaluationSpec]:
    """Benchmark, search and evaluation settings: the spec file's, then the flags'."""
    from pydantic import ValidationError

    from aflowrl.cli._io import load_spec
    from aflowrl.config import ConfigError, RunSpec, SearchSpec
    from aflowrl.config.environment import EvaluationSpec
    from aflowrl.errors import InvalidInputError

    spec = load_spec(args.spec) if args.spec else RunSpec()
    search: dict[str, Any] = spec.environment.search.model_dump(by_alias=False)
    if not args.spec:
        # Without a spec: the search guided by the policy's values for a policy proposer,
        # AFlow's own rule for the others (they have no values).
        if args.proposer == "policy":
            search.update(selection="fused", value_source="policy")
        else:
            search.update(selection="aflow", value_source="none")
    if args.selection == "fused" and not args.value_source:
        search["value_source"] = "policy" if args.proposer == "policy" else "anchor-mc"
    evaluation: dict[str, Any] = spec.environment.evaluation.model_dump(by_alias=False)
    # A second reading of a reward serves the trainer's noise report; one search has no use for it.
    evaluation["resample_fraction"] = 0.0
    if args.rounds < 1:
        raise InvalidInputError("must be at least 1", field="--rounds")
    search["max_steps"] = args.rounds
    mode = args.action_mode or ("text" if args.proposer == "llm" and not args.spec else None)
    for key, value in (
        ("selection", args.selection),
        ("value_source", args.value_source),
        ("action_mode", mode),
        ("convergence_rounds", args.convergence_rounds),
    ):
        if value is not None:
            search[key] = value
    for key, value in (
        ("repeats", args.repeats),
        ("max_problems", args.max_problems),
        ("concurrency", args.concurrency),
        ("problem_timeout_s", args.timeout),
    ):
        if value is not None:
            evaluation[key] = value
    try:
        search_spec = SearchSpec.model_validate(search)
        evaluation_spec = EvaluationSpec.model_validate(evaluation)
    except ValidationError as exc:
        raise ConfigError.from_validation_error(exc, prefix="settings") from None
    if search_spec.selection == "fused":
        usable = ("policy", "anchor-mc") if args.proposer == "policy" else ("anchor-mc",)
        if search_spec.value_source not in usable:
            raise InvalidInputError(
                f"fused selection with the {args.proposer} proposer needs --value-source "
                f"{' or '.join(usable)} (a critic exists only in training; policy values come "
                "from --proposer policy)",
                field="--value-source",
            )
    return str(args.benchmark), search_spec, evaluation_spec


async def _executor(args: argparse.Namespace, problems: Sequence[Problem]) -> Executor:
    """The executor ``--executor`` names (the surrogate indexes ``problems``); an endpoint is
    checked first (:func:`aflowrl.cli._io.executor_model`)."""
    from aflowrl.errors import InvalidInputError
    from aflowrl.executor.openai import OpenAIExecutor

    target = str(args.executor)
    if target == "surrogate":
        from aflowrl.executor.surrogate import SurrogateExecutor

        return SurrogateExecutor(problems)
    if target.startswith(("http://", "https://")):
        from aflowrl.cli._io import executor_model

        args.model = await executor_model(target, args.model)
        return OpenAIExecutor(target, args.model, max_concurrency=args.max_concurrency)
    raise InvalidInputError(
        f"{target!r} is neither an http(s) endpoint nor 'surrogate'", field="--executor"
    )


def _proposer(args: argparse.Namespace, mode: str) -> Proposer:
    from aflowrl.errors import InvalidInputError
    from aflowrl.search.proposers import LLMProposer, RandomProposer

    if args.proposer == "random":
        if mode == "freeform":
            raise InvalidInputError(
                "the random proposer picks edit actions: use --action-mode choice or text",
                field="--action-mode",
            )
        return RandomProposer(args.seed)
    if args.proposer == "llm":
        if not args.proposer_url:
            raise InvalidInputError("the llm proposer needs an endpoint", field="--proposer-url")
        import asyncio

        from aflowrl.cli._io import executor_model
        from aflowrl.executor.openai import OpenAIExecutor

        args.proposer_model = asyncio.run(
            executor_model(
                args.proposer_url,
                args.proposer_model,
                flag="--proposer-model",
                url_flag="--proposer-url",
            )
        )
        client = OpenAIExecutor(args.proposer_url, args.proposer_model, max_concurrency=4)
        return LLMProposer(client, seed=args.seed, max_retries=args.proposer_retries)
    if not args.policy:
        raise InvalidInputError("the policy proposer needs a checkpoint", field="--policy")
    from aflowrl.cli._io import load_spec
    from aflowrl.config import RunSpec
    from aflowrl.search.policy import PolicyProposer

    spec = load_spec(args.spec) if args.spec else RunSpec()
    value = spec.policy.value
    return PolicyProposer.load(
        args.policy,
        seed=args.seed,
        temperature=spec.rollout.sampling.temperature,
        value_range=(value.min, value.max) if value.enabled else None,
    )


def _problems(
    args: argparse.Namespace, benchmark_name: str
) -> tuple[list[Problem], list[Problem], str]:
    """Search problems, final-table problems and the name of the latter's split."""
    from aflowrl.benchmarks import get_benchmark
    from aflowrl.benchmarks.errors import DataNotFoundError
    from aflowrl.workflow import subset

    benchmark = get_benchmark(benchmark_name)
    validate = benchmark.load("validate", args.data_dir)
    try:
        return validate, benchmark.load("test", args.data_dir), "test"
    except DataNotFoundError:
        search = subset(validate, len(validate) // 2, args.seed)
        chosen = {p.problem_id for p in search}
        held_out = [p for p in validate if p.problem_id not in chosen]
        return search, held_out, "held-out validation"


@dataclass(frozen=True)
class _Plan:
    """What ``run`` resolved before any work starts."""

    benchmark: str
    search: SearchSpec
    evaluation: EvaluationSpec
    proposer: Proposer
    search_problems: list[Problem]
    final_problems: list[Problem]
    final_split: str


def run(args: argparse.Namespace) -> int:
    import asyncio

    benchmark_name, search, evaluation = _settings(args)
    search_problems, final_problems, final_split = _problems(args, benchmark_name)
    proposer = _proposer(args, search.action_mode)
    plan = _Plan(
        benchmark_name, search, evaluation, proposer, search_problems, final_problems, final_split
    )
    return asyncio.run(_run(args, plan))


async def _run(args: argparse.Namespace, plan: _Plan) -> int:
    import sys

    from aflowrl.benchmarks import get_benchmark
    from aflowrl.common.progress import progress_bar
    from aflowrl.search.episode import SearchContext
    from aflowrl.search.optimize import baselines, evaluate_final, final_table, run_search
    from aflowrl.search.rundir import RunDirectory
    from aflowrl.search.values import AnchorMonteCarlo
    from aflowrl.workflow import EvaluationCache, EvaluationSettings, Evaluator, RunSettings

    benchmark = get_benchmark(plan.benchmark)
    run_dir = RunDirectory(
        args.run_dir or f"runs/optimize-{plan.benchmark}-{args.proposer}-s{args.seed}"
    )
    executor = await _executor(args, [*plan.search_problems, *plan.final_problems])
    settings = EvaluationSettings(
        repeats=plan.evaluation.repeats,
        concurrency=plan.evaluation.concurrency,
        problem_timeout_s=plan.evaluation.problem_timeout_s,
        seed=args.seed,
        run=RunSettings(temperature=args.temperature, max_tokens=args.max_tokens),
    )
    manifest = {
        "benchmark": plan.benchmark,
        "seed": args.seed,
        "proposer": args.proposer,
        "proposer_model": args.proposer_model if args.proposer == "llm" else args.policy,
        "executor": executor.executor_id,
        "search": plan.search.model_dump(mode="json", exclude={"max_steps"}),
        "evaluation": plan.evaluation.model_dump(mode="json"),
        "search_problems": len(plan.search_problems),
        "final_split": plan.final_split,
        "rounds": args.rounds,
    }
    resuming = run_dir.check_manifest(manifest, ignore=frozenset({"rounds"}))
    print(
        f"{'resuming' if resuming else 'starting'} {run_dir.path}: {plan.benchmark}, "
        f"{args.rounds} rounds, {args.proposer} proposer, {len(plan.search_problems)} validation "
        "problems",
        file=sys.stderr,
    )
    bar = progress_bar(args.rounds, unit="round", enabled=False if args.no_progress else None)

    def on_round(record: dict[str, Any], state: Any) -> None:
        bar.n = min(args.rounds, int(record["round"]))
        bar.set_postfix(
            best=f"{100 * state.best_score:.1f}",
            last=f"{100 * float(record['score']):.1f}",
            calls=record.get("executor_calls", 0),
            refresh=False,
        )
        bar.refresh()

    try:
        with EvaluationCache(run_dir.cache_path) as cache:
            evaluator = Evaluator(executor, benchmark, settings=settings, cache=cache)
            values: Any = None
            if plan.search.selection == "fused":
                policy_values = getattr(plan.proposer, "values", None)
                values = (
                    policy_values if plan.search.value_source == "policy" else AnchorMonteCarlo()
                )
            ctx = SearchContext(
                evaluator, plan.search_problems, plan.search, plan.evaluation, values
            )
            state = await run_search(
                ctx, plan.proposer, run_dir, rounds=args.rounds, seed=args.seed, on_round=on_round
            )
            bar.close()
            print(
                f"best validation score {100 * state.best_score:.2f}% (workflow #{state.best}, "
                f"seed {100 * state.nodes[0].score:.2f}%) after {state.step} rounds "
                f"({state.done_reason}); {len(state.nodes)} workflows evaluated; best workflow "
                f"in {run_dir.path / 'best'}",
                file=sys.stderr,
            )
            if args.no_final:
                return 0
            rows = await evaluate_final(
                evaluator, plan.final_problems, baselines(state), repeats=plan.evaluation.repeats
            )
            table = final_table(rows, plan.final_split)
            run_dir.write_final(
                {
                    "split": plan.final_split,
                    "problems": len(plan.final_problems),
                    "rows": [
                        {"workflow": r.label, "validation": r.validation, **r.test.summary()}
                        for r in rows
                    ],
                },
                table,
            )
            print(table)
    finally:
        bar.close()
        await plan.proposer.aclose()
        await executor.aclose()
    return 0
