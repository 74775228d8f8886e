"""GSM8K: grade-school word problems, scored by the last number of the answer (AFlow's rule).

AFlow (``metagpt/ext/aflow/benchmark/gsm8k.py``) takes the last number of the model's output and
of the reference, with thousands separators removed, and counts a match when
|prediction - reference| <= 1e-6. A number is ``[-+]?\\d+(?:,\\d{3})*(?:\\.\\d+)?`` (or
``\\d+\\.\\d+``); ``\\d`` is any Unicode decimal digit, as in Python. No number in the prediction,
or none in the reference, scores 0.
"""

from __future__ import annotations

import re
from pathlib import Path

from aflowrl.benchmarks import _data
from aflowrl.benchmarks.base import Problem, Score, Split, TaskType, TextBenchmark

_NUMBER = re.compile(r"[-+]?\d+(?:,\d{3})*(?:\.\d+)?|\d+\.\d+")

TOLERANCE = 1e-6
"""Largest |prediction - reference| that still counts as equal."""


def extract_number(text: object) -> float | None:
    """The last number in ``str(text)`` with commas removed, or None when there is none.

    ``str()`` as in AFlow, so a numeric gold value (``"answer": 18`` in a split file, or a number
    passed to :meth:`GSM8K.score_answer`) scores as AFlow scores it."""
    matches = _NUMBER.findall(str(text))
    if not matches:
        return None
    try:
        return float(matches[-1].replace(",", ""))
    except ValueError:
        return None


class GSM8K(TextBenchmark):
    """GSM8K in AFlow's splits (264 validation, 1055 test problems)."""

    name = "gsm8k"
    task_type: TaskType = "math"

    def load(self, split: Split, data_dir: str | Path | None = None) -> list[Problem]:
        directory = _data.require_data_dir(self.name, data_dir)
        return _data.load_split(self, split, directory, self._problem_builder(split))

    def _problem_builder(self, split: Split) -> _data.ProblemBuilder:
        def build(path: Path, line: int, record: _data.Record, index: int) -> Problem:
            problem_id = (
                _data.text_field(path, line, record, "id", numbers=True)
                if "id" in record
                else f"gsm8k-{split}-{index}"
            )
            return Problem(
                benchmark=self.name,
                problem_id=problem_id,
                question=_data.text_field(path, line, record, "question"),
                gold=_data.text_field(path, line, record, "answer", numbers=True),
                record=record,
            )

        return build

    def score_detail(self, prediction: str, gold: str) -> Score:
        predicted = extract_number(prediction)
        expected = extract_number(gold)
        shown = "" if predicted is None else repr(predicted)
        if predicted is None:
            return Score(0.0, shown, "no number in the answer")
        if expected is None:
            # AFlow fails on the subtraction with None and scores the problem 0.
            return Score(0.0, shown, "no number in the reference")
        if abs(expected - predicted) <= TOLERANCE:
            return Score(1.0, shown, "")
        return Score(0.0, shown, f"expected {expected!r}, got {predicted!r}")
