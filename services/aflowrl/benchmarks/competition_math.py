"""MATH (Hendrycks et al., "competition_math"): scored by AFlow's answer-equivalence rule.

AFlow (``metagpt/ext/aflow/benchmark/math.py``) extracts the answer of the model's output and
of the reference solution alike: the last ``\\boxed{...}`` (one level of nested braces; deeper
nesting does not match), else the last sentence (text split at ``.``, ``!`` or ``?`` not preceded
by a digit and followed by whitespace). Two answers are equal when

1. their texts are equal; else
2. both read as numbers (commas removed; a trailing ``%`` or ``\\%`` divides by 100):
   equal iff ``isclose(a, b, abs_tol=1e-3)``, and nothing else is tried; else
3. symbolically: ``simplify(parse_expr(a) - parse_expr(b)) == 0``, or
   ``isclose(N(a), N(b), abs_tol=1e-3)`` (``_sympy_worker.symbolic_equal``).

Step 3 runs in a pool of worker processes with a time limit (``SymbolicJudge``): AFlow has no
limit and can hang; here an answer that takes longer scores 0 and is logged.
"""

from __future__ import annotations

import asyncio
import math
import re
import threading
from pathlib import Path

from aflowrl.benchmarks import _data
from aflowrl.benchmarks._symbolic import SymbolicJudge
from aflowrl.benchmarks.base import Problem, Score, Split, TaskType, TextBenchmark

_BOXED = re.compile(r"\\boxed{((?:[^{}]|{[^{}]*})*)}", re.DOTALL)
_SENTENCE_END = re.compile(r"(?<!\d)[.!?]\s+")

NUMERIC_TOLERANCE = 1e-3
"""Absolute tolerance of the numeric comparisons (AFlow's ``abs_tol``)."""


def extract_model_answer(text: str) -> str:
    """The last ``\\boxed{}`` content, stripped; else the last sentence; else ""."""
    boxed = _BOXED.findall(text)
    if boxed:
        return str(boxed[-1]).strip()
    sentences = [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]
    return sentences[-1] if sentences else ""


def parse_digits(text: str) -> float | None:
    """The number ``text`` reads as (commas removed, ``%`` or ``\\%`` = /100), else None."""
    number = text.replace(",", "")
    try:
        return float(number)
    except ValueError:
        if number.endswith("%"):
            number = number[:-1]
            if number.endswith("\\"):
                number = number[:-1]
            try:
                return float(number) / 100
            except ValueError:
                pass
    return None


class MATH(TextBenchmark):
    """MATH in AFlow's splits (119 validation, 486 test problems)."""

    name = "math"
    task_type: TaskType = "math"

    def __init__(
        self, *, symbolic_timeout_s: float = 10.0, symbolic_workers: int = 2, memory_mb: int = 2048
    ) -> None:
        self._symbolic_timeout_s = symbolic_timeout_s
        self._symbolic_workers = symbolic_workers
        self._memory_mb = memory_mb
        self._judge: SymbolicJudge | None = None
        self._judge_lock = threading.Lock()

    def load(self, split: Split, data_dir: str | Path | None = None) -> list[Problem]:
        directory = _data.require_data_dir(self.name, data_dir)

        def build(path: Path, line: int, record: _data.Record, index: int) -> Problem:
            return Problem(
                benchmark=self.name,
                problem_id=f"math-{split}-{index}",
                question=_data.text_field(path, line, record, "problem"),
                gold=_data.text_field(path, line, record, "solution", numbers=True),
                record=record,
            )

        return _data.load_split(self, split, directory, build)

    @property
    def judge(self) -> SymbolicJudge:
        """The sympy worker pool (started on first use)."""
        with self._judge_lock:
            if self._judge is None:
                self._judge = SymbolicJudge(
                    timeout_s=self._symbolic_timeout_s,
                    max_workers=self._symbolic_workers,
                    memory_mb=self._memory_mb,
                )
            return self._judge

    def math_equal(self, prediction: str, reference: str) -> tuple[bool, str]:
        """AFlow's ``math_equal`` on two extracted answers, and which test decided."""
        if prediction == reference:
            return True, "same text"
        predicted_number = parse_digits(prediction)
        reference_number = parse_digits(reference)
        if predicted_number is not None and reference_number is not None:
            equal = math.isclose(predicted_number, reference_number, abs_tol=NUMERIC_TOLERANCE)
            return equal, "numeric"
        verdict = self.judge.equal(prediction, reference)
        if verdict is None:
            return False, f"symbolic check ran over {self.judge.timeout_s:g} s"
        return verdict, "symbolic"

    def score_detail(self, prediction: str, gold: str) -> Score:
        expected = extract_model_answer(gold)
        predicted = extract_model_answer(prediction)
        equal, how = self.math_equal(predicted, expected)
        if equal:
            return Score(1.0, predicted, how)
        return Score(0.0, predicted, f"expected {expected!r} ({how})")

    async def score(self, problem: Problem, prediction: str) -> Score:
        # The symbolic test blocks for up to its time limit: keep it off the event loop.
        return await asyncio.to_thread(self.score_detail, prediction, problem.gold)

    def close(self) -> None:
        with self._judge_lock:
            judge = self._judge
        if judge is not None:
            judge.close()
