"""HotpotQA: multi-hop questions over given paragraphs, scored by SQuAD token F1 (AFlow's rule).

The workflow receives what AFlow gives it: ``Context: <paragraphs>\\n\\nQuestion: <q>\\n\\nAnswer:``
where each paragraph is its sentences joined by spaces and paragraphs are joined by newlines.
The score is the token F1 of the whole output against the reference answer
(:func:`aflowrl.benchmarks._f1.token_f1`).
"""

from __future__ import annotations

from pathlib import Path

from aflowrl.benchmarks import _data, _f1
from aflowrl.benchmarks.base import Problem, Score, Split, TaskType, TextBenchmark
from aflowrl.benchmarks.errors import DatasetLineError


def format_question(question: str, context: list[object]) -> str:
    """AFlow's input: the paragraphs (sentences joined by spaces), then the question."""
    paragraphs = [
        item[1]
        for item in context
        if isinstance(item, list) and len(item) > 1 and isinstance(item[1], list)
    ]
    context_text = "\n".join(" ".join(str(s) for s in paragraph) for paragraph in paragraphs)
    return f"Context: {context_text}\n\nQuestion: {question}\n\nAnswer:"


class HotpotQA(TextBenchmark):
    """HotpotQA in AFlow's split (200 validation problems; AFlow ships no test split)."""

    name = "hotpotqa"
    task_type: TaskType = "qa"

    def load(self, split: Split, data_dir: str | Path | None = None) -> list[Problem]:
        directory = _data.require_data_dir(self.name, data_dir)
        return _data.load_split(self, split, directory, self._build)

    def _build(self, path: Path, line: int, record: _data.Record, index: int) -> Problem:
        context = record.get("context")
        if not isinstance(context, list):
            raise DatasetLineError(
                path, line, "expected a list of [title, sentences]", field="context"
            )
        question = _data.text_field(path, line, record, "question")
        return Problem(
            benchmark=self.name,
            problem_id=_data.text_field(path, line, record, "_id", numbers=True),
            question=format_question(question, context),
            gold=_data.text_field(path, line, record, "answer", numbers=True),
            record=record,
        )

    def score_detail(self, prediction: str, gold: str) -> Score:
        f1 = _f1.token_f1(prediction, gold)
        return Score(f1, prediction, "" if f1 == 1.0 else f"F1 {f1:.3f} against {gold!r}")
