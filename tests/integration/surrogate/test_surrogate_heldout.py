"""The surrogate reads what a prompt asks for: held-out instructions on the real splits.

``heldout_instructions.json`` holds instructions in five categories (discarding the question,
reasoning paraphrases, negation, scope, stuffing and contradiction), written before the reader
and never used to tune it. Each is put in the instruction slot of
:func:`aflowrl.cli.surrogate_calibration.instruction_slot` and scored, through the real
evaluator, scorers and sandbox, on every benchmark's test split (HotpotQA: validation), seed 0.
Its score must fall in its band against references measured the same way:

* ``discard``: at least 10 points below IO (the library's, and the slot with no instruction);
* ``reasoning``: within 2 points of the slot with the CoT instruction (math and code: the
  library's CoT itself);
* ``no_reasoning``: within 2 points of the slot with "Give only the final answer, with no
  explanation." (negation read as negation: far from CoT wherever reasoning matters);
* ``not_above_cot``: not above the slot with the CoT instruction (stuffing, contradiction);
* ``plain``: not above the slot with no instruction (a reply format alone earns nothing).

One test per benchmark and category; references and scores of identical answers are shared
within the module.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from aflowrl.benchmarks import get_benchmark
from aflowrl.cli import surrogate_calibration as fitting
from aflowrl.executor.surrogate import SurrogateExecutor
from aflowrl.workflow import library

HELDOUT = json.loads(Path(__file__).with_name("heldout_instructions.json").read_text())[
    "instructions"
]
CATEGORIES = sorted({item["category"] for item in HELDOUT})
ANSWER_ONLY = "Give only the final answer, with no explanation."
QA_COT = "Think step by step."
SEEDS = (0,)

pytestmark = pytest.mark.slow


class _Bench:
    """One benchmark's problems, memoised scorer and reference scores."""

    def __init__(self, name: str, executor: SurrogateExecutor, data_dir: object) -> None:
        self.name = name
        self.benchmark = get_benchmark(name)
        self.task = self.benchmark.task_type
        self.problems = self.benchmark.load(fitting.split_for(name, "test"), data_dir)
        self.scorer = fitting.MemoizedScorer(self.benchmark)
        self.executor = executor
        self.references: dict[str, float] = {}

    async def score(self, instruction: str | None) -> float:
        graph = fitting.instruction_slot(self.task, instruction)
        scores = await fitting.evaluate_graph(
            self.executor, self.scorer, graph, self.problems, seeds=SEEDS
        )
        return scores[0]

    async def reference(self, name: str) -> float:
        if name not in self.references:
            if name == "io":
                graph = library.load("io", self.task)
                scores = await fitting.evaluate_graph(
                    self.executor, self.scorer, graph, self.problems, seeds=SEEDS
                )
                self.references[name] = scores[0]
            elif name == "slot_io":
                self.references[name] = await self.score(None)
            elif name == "cot":
                self.references[name] = await self.score(self.cot_instruction())
            else:
                self.references[name] = await self.score(ANSWER_ONLY)
        return self.references[name]

    def cot_instruction(self) -> str:
        if self.task == "qa":
            return QA_COT
        prompts = library.load("cot", self.task).to_dict()["prompts"]
        return str(next(iter(prompts.values())))


_BENCHES: dict[str, _Bench] = {}


@pytest.fixture
def bench(request, aflow_data, all_problems):
    name = request.param
    if name not in _BENCHES:
        _BENCHES[name] = _Bench(name, SurrogateExecutor(all_problems), aflow_data)
    return _BENCHES[name]


def _verdict(expect: str, score: float, refs: dict[str, float]) -> bool:
    if expect == "discard":
        return score <= min(refs["io"], refs["slot_io"]) - 10.0
    if expect == "reasoning":
        return abs(score - refs["cot"]) <= 2.0
    if expect == "no_reasoning":
        return abs(score - refs["answer_only"]) <= 2.0
    if expect == "not_above_cot":
        return score <= refs["cot"] + 1e-9
    if expect == "plain":
        return score <= refs["slot_io"] + 1e-9
    raise AssertionError(f"unknown band {expect!r}")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("category", CATEGORIES)
@pytest.mark.parametrize("bench", fitting.BENCHMARKS, indirect=True)
async def test_heldout_instructions_score_in_their_bands(bench, category):
    refs = {name: await bench.reference(name) for name in ("io", "slot_io", "cot", "answer_only")}
    outside = []
    for item in (i for i in HELDOUT if i["category"] == category):
        score = await bench.score(item["instruction"])
        if not _verdict(item["expect"], score, refs):
            outside.append(f"{score:.1f} ({item['expect']}): {item['instruction'][:100]}")
    assert not outside, f"{bench.name} references {refs}:\n" + "\n".join(outside)


def test_the_heldout_set_is_large_and_spans_every_category():
    assert len(HELDOUT) >= 40
    assert set(CATEGORIES) == {
        "discard-question",
        "reasoning-paraphrase",
        "negation",
        "scope",
        "stuffing-contradiction",
    }
    for category in CATEGORIES:
        assert sum(i["category"] == category for i in HELDOUT) >= 5, category


def _five_grams(text: str) -> set[str]:
    words = re.findall(r"[a-z]+", text.lower())
    return {" ".join(words[i : i + 5]) for i in range(len(words) - 4)}


def test_the_surrogates_code_never_mentions_a_heldout_instruction():
    """No five consecutive words of a held-out instruction appear in the surrogate's code
    (its lexicon, rules, docstrings or tests of the reader), so the bands measure the
    reading, not a list."""
    root = Path(__file__).resolve().parents[3]
    code = "\n".join(
        path.read_text(encoding="utf-8")
        for path in [
            *sorted((root / "services/aflowrl/executor/surrogate").glob("*.py")),
            *sorted((root / "tests/unit/executor/surrogate").glob("*.py")),
        ]
    )
    mentioned = _five_grams(code)
    for item in HELDOUT:
        if item["category"] == "stuffing-contradiction":
            continue  # keyword lists and repetitions: their windows are not phrasing
        shared = _five_grams(item["instruction"]) & mentioned
        assert not shared, (item["instruction"], shared)
