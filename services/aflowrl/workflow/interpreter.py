"""The interpreter: runs a workflow graph on one problem with an executor and a sandbox.

Every node becomes a task that waits for its inputs, so independent branches run concurrently,
and fan-outs and MedPrompt votes run their samples concurrently too; loops are bounded by their
node's parameters. The run returns the answer, tokens, cost (None when any call's price is
unknown), latency and a trace of every executor call and sandbox run.

Given a draw store (the evaluator passes its node cache), draws made by earlier runs of the same
node on the same problem and sample are reused (:mod:`aflowrl.workflow.runtime`): the run's
totals still count them, as what a cold run costs, and ``fresh`` says what this run paid.

For code workflows the output goes through final code extraction (the fenced block defining the
entry point, stripped of example calls), as the scorers run the code as given.

An operator that cannot parse the model's output fails the run (``RunResult.error`` says why,
the answer is empty, the problem scores 0); executor and sandbox infrastructure errors propagate
to the caller, because an unreachable executor is not a wrong answer.

Used by :class:`aflowrl.workflow.evaluator.Evaluator`, and directly to run one problem.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aflowrl import sandbox
from aflowrl.benchmarks.base import Problem
from aflowrl.executor.base import Executor, Usage
from aflowrl.workflow import operators, parsing
from aflowrl.workflow.errors import OperatorOutputError
from aflowrl.workflow.graph import Graph, Node
from aflowrl.workflow.ops import PROBLEM
from aflowrl.workflow.runtime import (
    Bill,
    CodeRunner,
    DrawStore,
    RunContext,
    RunSettings,
    TraceEvent,
    Value,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunResult:
    """The outcome of one workflow run on one problem."""

    answer: str
    """The workflow's final answer (for code workflows, the extracted code)."""
    error: str | None
    """Why the run produced no answer (unparseable model output), or None."""
    bill: Bill
    """Everything the run comprises, reused draws included: what a cold run costs."""
    fresh: Bill
    """What this run paid (the executor calls it made)."""
    latency_s: float
    """Wall time of the run."""
    trace: tuple[TraceEvent, ...]

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def cost_usd(self) -> float | None:
        """Executor cost; None when some call's price is unknown."""
        return self.bill.cost_usd

    @property
    def usage(self) -> Usage:
        return self.bill.usage

    @property
    def llm_calls(self) -> int:
        return self.bill.llm_calls

    @property
    def sandbox_runs(self) -> int:
        return self.bill.sandbox_runs

    def to_dict(self, *, trace: bool = True) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "answer": self.answer,
            "error": self.error,
            "cost_usd": self.cost_usd,
            "prompt_tokens": self.usage.prompt_tokens,
            "completion_tokens": self.usage.completion_tokens,
            "latency_s": self.latency_s,
            "llm_calls": self.llm_calls,
            "sandbox_runs": self.sandbox_runs,
            "fresh_llm_calls": self.fresh.llm_calls,
        }
        if trace:
            doc["trace"] = [event.to_dict() for event in self.trace]
        return doc


class Interpreter:
    """Runs graphs with one executor, one code runner and fixed settings."""

    def __init__(
        self,
        executor: Executor,
        code_runner: CodeRunner | None = None,
        settings: RunSettings | None = None,
    ) -> None:
        """``code_runner`` defaults to the project's sandbox (``aflowrl.sandbox.arun_python``)."""
        self.executor = executor
        self.code_runner: CodeRunner = code_runner or sandbox.arun_python
        self.settings = settings or RunSettings()

    async def run(
        self,
        graph: Graph,
        problem: Problem,
        *,
        seed: int = 0,
        public_tests: Sequence[str] | None = None,
        draws: DrawStore | None = None,
    ) -> RunResult:
        """Run ``graph`` on ``problem``; the same seed makes the same executor requests.

        ``public_tests`` (assert lines over ``candidate``, for Test nodes) default to the
        problem's own. ``draws``: where node draws are reused from and kept (its keys must
        cover the problem, its public tests, the seed and the executor settings).
        """
        ctx = RunContext(
            graph=graph,
            executor=self.executor,
            code_runner=self.code_runner,
            settings=self.settings,
            question=problem.question,
            entry_point=problem.entry_point,
            public_tests=tuple(problem.public_tests if public_tests is None else public_tests),
            seed=seed,
            upstream=graph.upstream,
            draws=draws,
        )
        started = time.perf_counter()
        error: str | None = None
        try:
            answer = await _execute(ctx, graph)
            if graph.task_type == "code":
                answer = _final_code(answer, problem)
        except OperatorOutputError as exc:
            logger.info(
                "%s/%s: workflow %s failed: %s",
                problem.benchmark,
                problem.problem_id,
                graph.name,
                exc,
            )
            answer, error = "", str(exc)
        return RunResult(
            answer=answer.strip(),
            error=error,
            bill=ctx.fresh + ctx.reused,
            fresh=ctx.fresh,
            latency_s=time.perf_counter() - started,
            trace=tuple(ctx.trace),
        )


def _final_code(answer: str, problem: Problem) -> str:
    entry_point = problem.entry_point
    if not entry_point:
        raise OperatorOutputError("output", "extract", "the problem names no entry point")
    try:
        return operators.code_of(answer, entry_point)
    except parsing.ParseFailure as exc:
        raise OperatorOutputError("output", "extract", str(exc)) from None


async def _execute(ctx: RunContext, graph: Graph) -> str:
    """Run every node as a task awaiting its inputs; return the output node's text."""
    tasks: dict[str, asyncio.Task[Value]] = {}

    async def run(node: Node) -> Value:
        values: dict[str, Value] = {}
        for _, ref in node.refs():
            if ref != PROBLEM and ref not in values:
                values[ref] = await tasks[ref]
        return await operators.run_node(ctx, node, values)

    for node in graph.topological():
        tasks[node.id] = asyncio.create_task(run(node), name=f"workflow:{node.id}")
    try:
        value = await tasks[graph.output]
    finally:
        pending = [t for t in tasks.values() if not t.done()]
        for task in pending:
            task.cancel()
        # Collect every task so no exception goes unretrieved.
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    if not isinstance(value, str):  # the validator makes the output a single solution
        raise TypeError(f"output {graph.output!r} gave {type(value).__name__}")
    return value
