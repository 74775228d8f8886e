"""DROP: discrete reasoning over paragraphs, scored by the best token F1 (AFlow's rule).

The reference ``ref_text`` holds the accepted answers joined by ``|``; AFlow splits the model's
output on ``|`` too and takes the best F1 over every (non-blank answer, output part) pair. A
reference with no non-blank answer scores 0 (AFlow's ``max`` of nothing fails and it scores 0).
"""

from __future__ import annotations

from pathlib import Path

from aflowrl.benchmarks import _data, _f1
from aflowrl.benchmarks.base import Problem, Score, Split, TaskType, TextBenchmark


class DROP(TextBenchmark):
    """DROP in AFlow's splits (200 validation, 400 test problems)."""

    name = "drop"
    task_type: TaskType = "qa"

    def load(self, split: Split, data_dir: str | Path | None = None) -> list[Problem]:
        directory = _data.require_data_dir(self.name, data_dir)
        return _data.load_split(self, split, directory, self._build)

    def _build(self, path: Path, line: int, record: _data.Record, index: int) -> Problem:
        return Problem(
            benchmark=self.name,
            problem_id=_data.text_field(path, line, record, "id", numbers=True),
            question=_data.text_field(path, line, record, "context"),
            gold=_data.text_field(path, line, record, "ref_text", numbers=True),
            record=record,
        )

    def score_detail(self, prediction: str, gold: str) -> Score:
        answers = [answer for answer in gold.split("|") if answer.strip() != ""]
        if not answers:
            return Score(0.0, prediction, "the reference has no answer")
        parts = prediction.split("|")
        best = max(_f1.token_f1(part, answer) for answer in answers for part in parts)
        return Score(
            best, prediction, "" if best == 1.0 else f"best F1 {best:.3f} against {gold!r}"
        )
