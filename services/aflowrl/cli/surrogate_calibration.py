"""Checking and fitting the calibration on the classic workflows (``aflowrl surrogate calibrate``).

:func:`measure` runs the classic workflows of the workflow library (IO, CoT, CoT-SC, MedPrompt,
Self-Refine) on each benchmark's split with several seeds, through the real evaluator and the
benchmarks' own scorers, and returns each cell's mean score next to its target: the AFlow
paper's Table 1 (gpt-4o-mini executor, test splits, percent). HotpotQA has no test split in
AFlow's data, so it is measured on its validation split, and the rows say so.

Scores of identical answers are memoised within a run (the scorers are deterministic), so a
code problem's hidden tests run once per distinct program, not once per sample.

:func:`fit` adjusts one parameter per cell, by secant steps on the measured residuals, until
every cell is within the tolerance (a Jacobi iteration: each round measures all cells, then
moves all parameters):

==============  =====================================  ========================================
cell            math and code                          QA
==============  =====================================  ========================================
IO              ``base_logit``                         ``verbose_plain`` (wordy plain answers)
CoT             ``step_by_step``                       ``base_logit`` (AnswerGenerate)
CoT-SC          ``vote_noise``, on the gain over CoT   ``vote_noise``, on the gain over CoT
MedPrompt       ``judge_skill``                        ``judge_skill``
Self-Refine     ``review_false_reject``                ``review_false_reject``
==============  =====================================  ========================================

A step x' = x + (target - measured) / slope uses the slope between the last two rounds when it
has the expected sign, else a prior slope (percent per unit), and is capped per parameter.

It lives beside its command (:mod:`aflowrl.cli.surrogate`), not in the executor package: it runs
workflows, and the workflow layer calls executors, never the reverse (an import-linter layers
contract keeps it so).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from aflowrl.benchmarks import get_benchmark
from aflowrl.benchmarks.base import Benchmark, Problem, Score, Split, TaskType
from aflowrl.errors import InvalidInputError
from aflowrl.executor.surrogate.calibration import BenchmarkParams, Calibration, param_bounds
from aflowrl.executor.surrogate.executor import SurrogateExecutor
from aflowrl.workflow import EvaluationSettings, Evaluator, Graph, library

logger = logging.getLogger(__name__)

BENCHMARKS: Final = ("hotpotqa", "drop", "humaneval", "mbpp", "gsm8k", "math")
"""In the paper's column order."""
WORKFLOWS: Final = library.CLASSIC
SEEDS: Final = (0, 1, 2)
TOLERANCE: Final = 3.0
"""Largest |measured - target| (points) a calibration may leave on a classic cell
(``calibrate --check``), and how far below AFlow's best a workflow of the operators may stay."""
SHIPPED_TOLERANCE: Final = 0.5
"""Largest |measured - target| (points) the shipped calibration leaves on a classic cell."""

TARGETS: Final[dict[str, dict[str, float]]] = {
    "hotpotqa": {"io": 68.1, "cot": 67.9, "cot_sc": 68.9, "medprompt": 68.3, "self_refine": 60.8},
    "drop": {"io": 68.3, "cot": 78.5, "cot_sc": 78.8, "medprompt": 78.0, "self_refine": 70.2},
    "humaneval": {"io": 87.0, "cot": 88.6, "cot_sc": 91.6, "medprompt": 91.6, "self_refine": 87.8},
    "mbpp": {"io": 71.8, "cot": 71.8, "cot_sc": 73.6, "medprompt": 73.6, "self_refine": 69.8},
    "gsm8k": {"io": 92.7, "cot": 92.4, "cot_sc": 92.7, "medprompt": 90.0, "self_refine": 89.6},
    "math": {"io": 48.6, "cot": 48.8, "cot_sc": 50.4, "medprompt": 50.0, "self_refine": 46.1},
}
"""AFlow (ICLR 2025) Table 1: the classic workflows with gpt-4o-mini, percent."""

BEST: Final[dict[str, float]] = {
    "hotpotqa": 73.5,
    "drop": 80.6,
    "humaneval": 94.7,
    "mbpp": 83.4,
    "gsm8k": 93.5,
    "math": 56.2,
}
"""The same table's best (AFlow's own workflows): what a search should be able to reach."""


def split_for(benchmark: str, split: Split) -> Split:
    """The split a benchmark is measured on: HotpotQA has only a validation split."""
    return "validate" if benchmark == "hotpotqa" else split


@dataclass(frozen=True)
class Cell:
    """One benchmark x workflow measurement."""

    benchmark: str
    workflow: str
    split: str
    measured: float
    """Mean score over the seeds, percent."""
    target: float | None
    per_seed: tuple[float, ...] = ()

    @property
    def residual(self) -> float:
        return 0.0 if self.target is None else self.measured - self.target

    def to_row(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark,
            "workflow": self.workflow,
            "measured": round(self.measured, 2),
            "target": self.target,
            "split": self.split,
            "per_seed": [round(s, 2) for s in self.per_seed],
        }


class MemoizedScorer(Benchmark):
    """A benchmark whose ``score`` remembers the score of each (problem, answer) it has seen.

    Scoring is a pure function of the problem and the answer text (code: the hidden tests in
    the sandbox; MATH: the symbolic check), so within one measurement identical answers are
    scored once.
    """

    def __init__(self, benchmark: Benchmark) -> None:
        self.inner = benchmark
        self.name = benchmark.name
        self.task_type = benchmark.task_type
        self._scores: dict[tuple[str, str], asyncio.Future[Score]] = {}

    def load(self, split: Split, data_dir: str | Path | None = None) -> list[Problem]:
        return self.inner.load(split, data_dir)

    async def score(self, problem: Problem, prediction: str) -> Score:
        key = (problem.problem_id, prediction)
        future = self._scores.get(key)
        if future is None:
            future = asyncio.ensure_future(self.inner.score(problem, prediction))
            self._scores[key] = future
        try:
            return await asyncio.shield(future)
        except BaseException:
            if future.done():
                self._scores.pop(key, None)
            raise


ProgressCallback = Callable[[Cell], None]


def instruction_slot(task_type: TaskType, instruction: str | None) -> Graph:
    """The workflow an instruction is measured in: one Custom (math, QA) or CustomCodeGenerate
    (code) call with ``instruction`` (None: none, which for math and code is the library's
    IO; with the library's CoT instruction it is the library's CoT), and for QA a Format step
    after it. QA is scored by token F1 over the whole output, so a QA workflow extracts its
    answer; the Format step makes the measure what the instruction does to the answer, not
    to the reply's length."""
    doc = library.load("io", task_type).to_dict()
    doc["name"] = "instruction_slot"
    if instruction is not None:
        doc["prompts"] = {"instruction": instruction}
        doc["nodes"][0]["params"] = {"instruction": "instruction"}
    if task_type == "qa":
        doc["nodes"].append({"id": "format", "op": "Format", "inputs": {"solution": "generate"}})
        doc["output"] = "format"
    return Graph.from_dict(doc, source="instruction slot")


async def evaluate_graph(
    executor: SurrogateExecutor,
    scorer: Benchmark,
    graph: Graph,
    problems: Sequence[Problem],
    *,
    seeds: Sequence[int] = SEEDS,
    concurrency: int = 32,
) -> list[float]:
    """Percent scores of ``graph`` on ``problems``, one per seed (seeds run concurrently)."""

    async def one(seed: int) -> float:
        settings = EvaluationSettings(seed=seed, concurrency=concurrency)
        evaluator = Evaluator(executor, scorer, settings=settings)
        result = await evaluator.evaluate(graph, problems)
        return 100.0 * result.score_mean

    return list(await asyncio.gather(*(one(seed) for seed in seeds)))


async def measure(
    executor: SurrogateExecutor,
    *,
    data_dir: str | Path | None,
    split: Split = "test",
    benchmarks: Iterable[str] = BENCHMARKS,
    workflows: Iterable[str] = WORKFLOWS,
    seeds: Sequence[int] = SEEDS,
    concurrency: int = 32,
    limit: int | None = None,
    progress: ProgressCallback | None = None,
) -> list[Cell]:
    """Run every classic workflow on every benchmark (``limit``: only the first N problems)."""
    cells: list[Cell] = []
    workflow_names = list(workflows)
    for name in benchmarks:
        benchmark = get_benchmark(name)
        used = split_for(name, split)
        problems = benchmark.load(used, data_dir)[:limit]
        scorer = MemoizedScorer(benchmark)
        for workflow in workflow_names:
            graph = library.load(workflow, benchmark.task_type)
            started = time.perf_counter()
            scores = await evaluate_graph(
                executor, scorer, graph, problems, seeds=seeds, concurrency=concurrency
            )
            cell = Cell(
                name,
                workflow,
                used,
                statistics.fmean(scores),
                TARGETS.get(name, {}).get(workflow),
                tuple(scores),
            )
            logger.info(
                "%s %s: %.2f (target %s) in %.1f s",
                name,
                workflow,
                cell.measured,
                cell.target,
                time.perf_counter() - started,
            )
            cells.append(cell)
            if progress is not None:
                progress(cell)
    return cells


def table(cells: Sequence[Cell]) -> str:
    """Measured next to target, one line per cell."""
    lines = [
        f"{'benchmark':<10} {'workflow':<12} {'split':<9} {'measured':>8} {'target':>7} {'diff':>6}"
    ]
    for cell in cells:
        target = "" if cell.target is None else f"{cell.target:.1f}"
        diff = "" if cell.target is None else f"{cell.residual:+.1f}"
        lines.append(
            f"{cell.benchmark:<10} {cell.workflow:<12} {cell.split:<9} {cell.measured:>8.2f} "
            f"{target:>7} {diff:>6}"
        )
    return "\n".join(lines)


# --- fitting -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Knob:
    """The parameter a cell's residual moves, with its prior slope and largest step."""

    param: str
    slope: float
    """Prior d(score %)/d(param)."""
    max_step: float
    relative_to: str | None = None
    """Fit the cell's gain over this workflow instead of its level."""


_KNOBS: Final[dict[str, dict[str, _Knob]]] = {
    "math": {
        "io": _Knob("base_logit", 8.0, 1.5),
        "cot": _Knob("step_by_step", 8.0, 1.0),
        "cot_sc": _Knob("vote_noise", -2.0, 1.0, relative_to="cot"),
        "medprompt": _Knob("judge_skill", 4.0, 1.0),
        "self_refine": _Knob("review_false_reject", -20.0, 0.15),
    },
    "qa": {
        "cot": _Knob("base_logit", 8.0, 1.5),
        "io": _Knob("verbose_plain", -40.0, 0.2),
        "cot_sc": _Knob("vote_noise", -2.0, 1.0, relative_to="cot"),
        "medprompt": _Knob("judge_skill", 4.0, 1.0),
        "self_refine": _Knob("review_false_reject", -20.0, 0.15),
    },
}
_KNOBS["code"] = _KNOBS["math"]


@dataclass
class FitReport:
    """What a fit did: the rounds' largest residuals and the final cells."""

    rounds: list[float] = field(default_factory=list)
    cells: list[Cell] = field(default_factory=list)


def _objective(cells: dict[str, Cell], workflow: str, knob: _Knob) -> tuple[float, float]:
    """(measured, target) of what ``knob`` fits: the level, or the gain over a base cell."""
    cell = cells[workflow]
    target = cell.target if cell.target is not None else cell.measured
    if knob.relative_to is None:
        return cell.measured, target
    base = cells[knob.relative_to]
    base_target = base.target if base.target is not None else base.measured
    return cell.measured - base.measured, target - base_target


async def fit(
    executor_factory: Callable[[Calibration], SurrogateExecutor],
    calibration: Calibration,
    *,
    data_dir: str | Path | None,
    split: Split = "test",
    benchmarks: Iterable[str] = BENCHMARKS,
    seeds: Sequence[int] = SEEDS,
    rounds: int = 6,
    tolerance: float = 1.0,
    concurrency: int = 32,
    limit: int | None = None,
    progress: ProgressCallback | None = None,
) -> tuple[Calibration, FitReport]:
    """Fit ``calibration`` until every classic cell is within ``tolerance`` points (or
    ``rounds`` run out); returns the best calibration seen and what happened."""
    names = list(benchmarks)
    if rounds < 1:
        raise InvalidInputError("must be at least 1", field="rounds")
    history: dict[tuple[str, str], tuple[float, float]] = {}
    report = FitReport()
    best: tuple[float, Calibration, list[Cell]] | None = None
    current = calibration
    for round_index in range(rounds):
        executor = executor_factory(current)
        cells = await measure(
            executor,
            data_dir=data_dir,
            split=split,
            benchmarks=names,
            seeds=seeds,
            concurrency=concurrency,
            limit=limit,
            progress=progress,
        )
        worst = max(abs(c.residual) for c in cells)
        report.rounds.append(worst)
        logger.info("fit round %d: largest residual %.2f points", round_index + 1, worst)
        if best is None or worst < best[0]:
            best = (worst, current, cells)
        if worst <= tolerance or round_index == rounds - 1:
            break
        for name in names:
            by_workflow = {c.workflow: c for c in cells if c.benchmark == name}
            current = current.with_params(
                name, _step(current.params(name), name, by_workflow, history)
            )
    assert best is not None
    _, fitted, final_cells = best
    report.cells = final_cells
    return fitted, report


def _step(
    params: BenchmarkParams,
    benchmark: str,
    cells: dict[str, Cell],
    history: dict[tuple[str, str], tuple[float, float]],
) -> BenchmarkParams:
    """One secant step on each of ``benchmark``'s knobs."""
    task = get_benchmark(benchmark).task_type
    changes: dict[str, float] = {}
    for workflow, knob in _KNOBS[task].items():
        if workflow not in cells or (knob.relative_to and knob.relative_to not in cells):
            continue
        measured, target = _objective(cells, workflow, knob)
        value = float(getattr(params, knob.param))
        slope = knob.slope
        previous = history.get((benchmark, knob.param))
        if previous is not None and abs(value - previous[0]) > 1e-9:
            secant = (measured - previous[1]) / (value - previous[0])
            if secant * knob.slope > 0 and abs(secant) > abs(knob.slope) / 10:
                slope = secant
        history[(benchmark, knob.param)] = (value, measured)
        step = (target - measured) / slope
        step = max(-knob.max_step, min(knob.max_step, step))
        changes[knob.param] = _clamp(knob.param, value + step)
    return dataclasses.replace(params, **changes)


def with_fit_notes(
    calibration: Calibration, report: FitReport, split: Split, seeds: Sequence[int]
) -> Calibration:
    """``calibration`` with a record of how it was fitted and what it measured."""
    notes = {
        "procedure": "aflowrl surrogate calibrate --fit: Jacobi secant steps, one parameter "
        "per classic cell (see aflowrl.cli.surrogate_calibration)",
        "targets": "AFlow (ICLR 2025) Table 1, gpt-4o-mini executor",
        "split": split,
        "hotpotqa_split": split_for("hotpotqa", split),
        "seeds": list(seeds),
        "largest_residual_per_round": [round(r, 2) for r in report.rounds],
        "cells": [c.to_row() for c in report.cells],
    }
    return dataclasses.replace(calibration, fit=notes)


def _clamp(name: str, value: float) -> float:
    low, high = param_bounds(name)
    return round(min(max(value, low), high), 4)
