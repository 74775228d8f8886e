"""``aflowrl optimize`` without the command line: run one search with a proposer, resumably.

:func:`run_search` plays one episode of the search state machine (:mod:`aflowrl.search.episode`)
with ``max_steps`` = the number of rounds: each round the proposer reads the observation and
writes a response, the step projects it, evaluates the child and selects the next parent.
After every round the run directory (:mod:`aflowrl.search.rundir`) gets the round's record and
the new state, so an interrupted run resumes where it stopped (with the evaluation cache in the
same directory, nothing is evaluated twice). With ``fused`` selection and ``anchor-mc`` values
the table of mean observed returns per workflow is rebuilt from the state's attempts (each
edit's reward is the return observed from its parent), so it resumes too.

:func:`evaluate_final` scores the best workflow, the seed and the classic baselines on the test
split and :func:`final_table` prints them. Used by :mod:`aflowrl.cli.optimize` and
``bench/search_cache.py``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aflowrl.benchmarks.base import Problem
from aflowrl.search.episode import (
    SearchContext,
    StepOutcome,
    observe,
    project_action,
    reset,
    step,
)
from aflowrl.search.proposers import Proposer
from aflowrl.search.rundir import RunDirectory
from aflowrl.search.state import EpisodeState, graph_at
from aflowrl.search.values import AnchorMonteCarlo
from aflowrl.workflow import EvaluationResult, Evaluator, Graph, library

logger = logging.getLogger(__name__)

RoundCallback = Callable[[dict[str, Any], EpisodeState], None]


def record_returns(table: AnchorMonteCarlo, state: EpisodeState, attempts: int = 0) -> None:
    """Add the returns of the state's attempts from index ``attempts`` on to ``table``."""
    for attempt in state.attempts[attempts:]:
        table.record(state.nodes[attempt.parent].hash, attempt.reward)


def _round_record(outcome: StepOutcome, proposal_attempts: int, wall_s: float) -> dict[str, Any]:
    info = outcome.info
    return {
        "round": info.step_index + 1,
        "parent": info.parent_index,
        "action": info.canonical_action,
        "valid": info.valid_action,
        "reason": info.invalid_reason,
        "child": info.child_index,
        "duplicate": info.duplicate,
        "score": info.child_score,
        "parent_score": info.parent_score,
        "reward": outcome.reward,
        "best_score": info.best_score,
        "executor_calls": info.executor_calls,
        "cache_hits": info.cache_hits,
        "cost_usd": info.cost_usd,
        "proposer_attempts": proposal_attempts,
        "wall_s": round(wall_s, 3),
    }


def _extend(state: EpisodeState, rounds: int) -> EpisodeState:
    """The state with ``rounds`` as its step budget (a resumed run may ask for more)."""
    if state.search.max_steps == rounds:
        return state
    search = state.search.model_copy(update={"max_steps": rounds})
    done = state.done
    reason = state.done_reason
    if reason == "max_steps":
        done = state.step >= rounds
        reason = reason if done else ""
    return state.model_copy(update={"search": search, "done": done, "done_reason": reason})


async def run_search(
    ctx: SearchContext,
    proposer: Proposer,
    run_dir: RunDirectory,
    *,
    rounds: int,
    seed: int,
    on_round: RoundCallback | None = None,
) -> EpisodeState:
    """Run (or resume) the search to ``rounds`` rounds; returns the final state."""
    state = run_dir.load_state()
    if state is None:
        started = time.perf_counter()
        start = await reset(ctx, seed=seed, max_steps=rounds, episode_id=run_dir.path.name)
        state = start.state
        seed_node = state.nodes[0]
        record = {
            "round": 0,
            "parent": None,
            "action": "seed workflow",
            "valid": True,
            "child": 0,
            "score": seed_node.score,
            "best_score": seed_node.score,
            "executor_calls": start.seed_evaluation.executor_calls,
            "cache_hits": start.seed_evaluation.cache_hits,
            "cost_usd": start.seed_evaluation.cost_usd,
            "wall_s": round(time.perf_counter() - started, 3),
        }
        run_dir.commit_round(record, state, graph_at(state, 0))
        if on_round is not None:
            on_round(record, state)
    else:
        logger.info("resuming %s after round %d", run_dir.path, state.step)
        state = _extend(state, rounds)
    if isinstance(ctx.values, AnchorMonteCarlo):
        record_returns(ctx.values, state)
    while not state.done:
        started = time.perf_counter()
        current = state
        observation = observe(ctx, current)
        proposal = await proposer.propose(
            observation,
            round=current.step,
            check=functools.partial(project_action, ctx, current),
        )
        outcome = await step(ctx, current, proposal.response)
        state = outcome.state
        if isinstance(ctx.values, AnchorMonteCarlo):
            record_returns(ctx.values, state, len(current.attempts))
        record = _round_record(outcome, proposal.attempts, time.perf_counter() - started)
        record["proposer_cost_usd"] = proposal.cost_usd
        new = outcome.info.child_index is not None and not outcome.info.duplicate
        index = outcome.info.child_index
        workflow = graph_at(state, index) if index is not None and new else None
        run_dir.commit_round(record, state, workflow)
        if on_round is not None:
            on_round(record, state)
    run_dir.write_tree(state)
    run_dir.write_best(state)
    return state


@dataclass(frozen=True)
class FinalRow:
    """One workflow of the final table."""

    label: str
    graph: Graph
    validation: float | None
    """Its validation score during the search (None for baselines not in the tree)."""
    test: EvaluationResult


def baselines(state: EpisodeState) -> list[tuple[str, Graph, float | None]]:
    """The best workflow, the seed and the classic baselines (label, graph, validation score)."""
    best = graph_at(state, state.best)
    rows: list[tuple[str, Graph, float | None]] = [
        (f"best (#{state.best})", best, state.best_score),
        ("seed", graph_at(state, 0), state.nodes[0].score),
    ]
    for name in library.CLASSIC:
        graph = library.load(name, state.task_type)
        index = state.index_of(graph.content_hash)
        rows.append((name, graph, state.nodes[index].score if index is not None else None))
    return rows


async def evaluate_final(
    evaluator: Evaluator,
    problems: Sequence[Problem],
    rows: Sequence[tuple[str, Graph, float | None]],
    *,
    repeats: int,
) -> list[FinalRow]:
    """Score each workflow on ``problems`` (the test split)."""
    results = []
    for label, graph, validation in rows:
        result = await evaluator.evaluate(graph, problems, repeats=repeats)
        results.append(FinalRow(label, graph, validation, result))
    return results


def final_table(rows: Sequence[FinalRow], split: str) -> str:
    """Plain-text table: workflow, validation score, score on ``split``, spread, cost, calls."""
    header = ["workflow", "validation %", f"{split} %", "+- std", "cost $", "calls", "cached"]
    lines = []
    for row in rows:
        cost = row.test.cost_usd
        lines.append(
            [
                row.label,
                "-" if row.validation is None else f"{100 * row.validation:.2f}",
                f"{100 * row.test.score_mean:.2f}",
                f"{100 * row.test.score_std:.2f}",
                "unknown" if cost is None else f"{cost:.4f}",
                str(row.test.executor_calls),
                str(row.test.cache_hits),
            ]
        )
    widths = [max(len(h), *(len(r[i]) for r in lines)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, lines)])
