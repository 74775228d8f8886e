"""The surrogate's decisions: right or wrong, which wrong answer, which verdict, which letter.

:meth:`SurrogateModel.reply` reads the request (:mod:`.reading`), finds what it knows of the
problem (:mod:`.facts`) and decides, with the benchmark's parameters (:mod:`.calibration`):

* **answers** (plain, step by step, answer-only, code, ``solve()`` programs): right with
  P = sigmoid((a + s e_p + effects) / T); a wrong one is the problem's attractor with
  probability ``attractor``, else another plausible wrong answer. Earlier results shown in the
  prompt are followed (their most common answer is adopted) with probability ``hint_follow``;
* **reviews** judge the shown solution against the reference (the surrogate checks it, as a
  simulator may; code runs in the sandbox): a right one is rejected with probability
  ``review_false_reject``, a wrong one with probability ``review_detect``;
* **revisions** turn a wrong solution right with probability ``revise_fix`` and a right one
  wrong with probability ``revise_break``; **fixes after failed tests** succeed with
  ``test_fix``; **programs** crash with ``program_error`` and rewritten ones run with
  ``program_fix``;
* **choices** among labelled candidates are a noisy majority vote over the candidates shown:
  each distinct answer scores its count, plus, when asked to judge critically, ``judge_skill``
  if it is right and a per-problem preference (``judge_bias`` times a normal deviate fixed by
  the problem and the answer), plus ``vote_noise`` T times fresh noise; the best-scoring answer's
  candidate is chosen;
* **extractions** give the shown solution's own answer in short form.

Randomness: every draw is a hash of (surrogate seed, request seed, choice index, problem, request
kind, what is drawn) (:mod:`._draws`), so answers depend only on the prompt, the seed and the
temperature. Prompts of one kind on one problem share their draws whatever their wording:
a better prompt changes an answer only where its better odds matter (common random numbers,
which keep the differences between workflows free of needless noise). At temperature T the
log-odds of every probability are divided by T; T = 0 gives the mode (right iff P > 1/2, the
attractor when wrong, no vote noise).
"""

from __future__ import annotations

import ast
import functools
import math
import re
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from aflowrl.benchmarks import get_benchmark
from aflowrl.benchmarks.base import Problem, TextBenchmark
from aflowrl.benchmarks.competition_math import extract_model_answer, parse_digits
from aflowrl.benchmarks.gsm8k import extract_number
from aflowrl.executor.surrogate import _draws, writing
from aflowrl.executor.surrogate.calibration import BenchmarkParams, Calibration
from aflowrl.executor.surrogate.codelab import CodeLab
from aflowrl.executor.surrogate.facts import ProblemFacts, format_number, problem_facts
from aflowrl.executor.surrogate.index import ProblemIndex
from aflowrl.executor.surrogate.reading import Reading, read_request

MODEL_VERSION = 2
"""Version of the decision rules: part of the executor id (bump when answers change)."""

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
KEEP_WRONG = 0.6
"""Probability that a failed revision or fix keeps the same wrong answer."""
_REMEMBERED = 8192
_TAG = {
    tag: re.compile(rf"<{tag}>(.*?)(?:</{tag}>|\Z)", re.DOTALL) for tag in ("answer", "solution")
}
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_SPACES = re.compile(r"\s+")
_LATEX_NOISE = re.compile(r"\\left|\\right|\\!|\\,|\\;|\$|\\displaystyle")


@dataclass(frozen=True)
class Assessment:
    """What a shown solution answers, and whether that is right."""

    key: Hashable
    """Equal for solutions that give the same answer."""
    correct: bool
    answer: str
    """The answer in short form (for code: the code)."""


class _Sampler:
    """Draws for one reply: hashes of the request's parts and what is drawn."""

    __slots__ = ("parts", "temperature")

    def __init__(self, parts: tuple[object, ...], temperature: float) -> None:
        self.parts = parts
        self.temperature = temperature

    def uniform(self, *what: object) -> float:
        return _draws.uniform(*self.parts, *what)

    def chance_logit(self, logit: float, *what: object) -> bool:
        """True with probability sigmoid(logit / T) (T = 0: iff logit > 0)."""
        if self.temperature <= 0.0:
            return logit > 0.0
        scaled = max(min(logit / self.temperature, 60.0), -60.0)
        return self.uniform(*what) < 1.0 / (1.0 + math.exp(-scaled))

    def chance(self, probability: float, *what: object) -> bool:
        """True with probability p, sharpened or flattened by the temperature."""
        if probability <= 0.0:
            return False
        if probability >= 1.0:
            return True
        return self.chance_logit(math.log(probability / (1.0 - probability)), *what)

    def index(self, count: int, *what: object) -> int:
        if self.temperature <= 0.0 or count <= 1:
            return 0
        return min(int(self.uniform(*what) * count), count - 1)

    def normal(self, *what: object) -> float:
        if self.temperature <= 0.0:
            return 0.0
        return self.temperature * _draws.normal(*self.parts, *what)

    def pick(self, count: int, what: str) -> int:
        return self.index(count, "phrase", what)


class SurrogateModel:
    """Answers chat requests about known benchmark problems like a calibrated LLM."""

    def __init__(
        self,
        index: ProblemIndex,
        calibration: Calibration,
        *,
        seed: int = 0,
        lab: CodeLab | None = None,
    ) -> None:
        self.index = index
        self.calibration = calibration
        self.seed = seed
        self.lab = lab or CodeLab()
        self.unknown_prompts = 0
        self._facts: dict[tuple[str, str], ProblemFacts] = {}
        self._readings: OrderedDict[tuple[str, ...], Reading] = OrderedDict()
        self._code_keys: dict[str, Hashable] = {}

    # --- entry points ----------------------------------------------------------------------

    def read(self, contents: Sequence[str]) -> Reading:
        """The reading of a request (remembered for recent prompts)."""
        key = tuple(contents)
        found = self._readings.get(key)
        if found is None:
            found = read_request(key, self.index)
            self._readings[key] = found
            if len(self._readings) > _REMEMBERED:
                self._readings.popitem(last=False)
        else:
            self._readings.move_to_end(key)
        return found

    def facts(self, problem: Problem) -> ProblemFacts:
        key = (problem.benchmark, problem.problem_id)
        found = self._facts.get(key)
        if found is None:
            params = self.calibration.params(problem.benchmark)
            found = problem_facts(problem, params, str(self.calibration.seed))
            self._facts[key] = found
        return found

    async def reply(
        self, contents: Sequence[str], *, seed: int, choice: int, temperature: float
    ) -> str:
        """One completion of the request (``choice``: its index among ``n``)."""
        reading = self.read(contents)
        if reading.match is None:
            self.unknown_prompts += 1
            sampler = _Sampler((self.seed, seed, choice, "unknown", reading.kind), temperature)
            return _generic(reading, sampler)
        facts = self.facts(reading.match.problem)
        params = self.calibration.params(facts.benchmark)
        sampler = _Sampler(
            (self.seed, seed, choice, facts.benchmark, facts.problem.problem_id, reading.kind),
            temperature,
        )
        if reading.kind in ("answer", "code", "program", "program_fix"):
            return await self._generate(reading, facts, params, sampler)
        if reading.kind == "choose":
            return await self._choose(reading, facts, params, sampler)
        if reading.kind == "review":
            return await self._review(reading, facts, params, sampler)
        if reading.kind == "revise":
            return await self._revise(reading, facts, params, sampler)
        if reading.kind == "test_fix":
            return await self._test_fix(reading, facts, params, sampler)
        return await self._format(reading, facts, params, sampler)

    # --- generation ------------------------------------------------------------------------

    def logit(self, reading: Reading, facts: ProblemFacts, params: BenchmarkParams) -> float:
        """Log-odds that a generated answer is right: a + s e_p + the prompt's effects."""
        logit = params.base_logit + params.spread * facts.ease
        if reading.step_by_step:
            logit += params.step_by_step
        if reading.kind in ("program", "program_fix"):
            logit += params.program  # a program is worked reasoning, however briefly asked for
        elif reading.answer_only and facts.task != "code":
            logit += params.answer_only
        return logit

    async def _generate(
        self, reading: Reading, facts: ProblemFacts, params: BenchmarkParams, s: _Sampler
    ) -> str:
        if reading.discard is not None:
            return writing.discarded(reading, facts, s.pick, s.uniform)
        followed = await self._follow(reading.shown, facts, params, s)
        if followed is not None:
            correct, shown_answer = followed.correct, followed.answer
        else:
            correct = s.chance_logit(self.logit(reading, facts, params), "correct")
            shown_answer = None
        if facts.task == "code" and reading.kind not in ("program", "program_fix"):
            code = (
                facts.answer
                if correct
                else (shown_answer or await self._wrong_code(facts, params, s))
            )
            return writing.code_answer(reading, code, facts)
        answer = facts.answer if correct else (shown_answer or self._wrong_text(facts, params, s))
        if reading.kind in ("program", "program_fix"):
            crash = (
                s.chance(params.program_error, "crash")
                if reading.kind == "program"
                else not s.chance(params.program_fix, "fixed")
            )
            return writing.program(facts, answer, crash, s.pick)
        if facts.task == "math":
            return writing.math_answer(facts, reading, answer, correct, s.pick)
        return self._qa_reply(reading, facts, params, s, answer=answer, correct=correct)

    def _qa_reply(
        self,
        reading: Reading,
        facts: ProblemFacts,
        params: BenchmarkParams,
        s: _Sampler,
        *,
        answer: str,
        correct: bool,
    ) -> str:
        short = answer
        if correct and s.chance(params.imprecise_concise, "imprecise"):
            short = writing.imprecise(facts, answer, s.pick)
        wordy = None
        if not reading.tags and not reading.concise and not reading.step_by_step:
            chance = max(params.verbose_plain, 0.85) if reading.verbose else params.verbose_plain
            if s.chance(chance, "wordy"):
                wordy = writing.wordy(facts, answer, s.pick)
        return writing.qa_answer(facts, reading, short, wordy)

    def _wrong_rank(self, params: BenchmarkParams, s: _Sampler, count: int) -> int:
        if count <= 1 or s.chance(params.attractor, "attractor"):
            return 0
        return 1 + s.index(count - 1, "wrong")

    def _wrong_text(self, facts: ProblemFacts, params: BenchmarkParams, s: _Sampler) -> str:
        if not facts.wrong:
            return "0" if facts.task == "math" else "unknown"
        return facts.wrong[self._wrong_rank(params, s, len(facts.wrong))]

    async def _wrong_code(
        self, facts: ProblemFacts, params: BenchmarkParams, s: _Sampler, avoid: str = ""
    ) -> str:
        variants = await self.lab.wrong_variants(facts.problem, facts.answer)
        visible = s.chance(params.visible_failure, "visible")
        rank = self._wrong_rank(params, s, len(variants.visible) + len(variants.hidden))
        code = variants.choose(visible, rank)
        if avoid and code.strip() == avoid.strip():
            code = variants.choose(visible, rank + 1)
        return code

    async def _follow(
        self, shown: Sequence[str], facts: ProblemFacts, params: BenchmarkParams, s: _Sampler
    ) -> Assessment | None:
        """The most common answer among earlier results shown, when the reply adopts it."""
        if not shown or not s.chance(params.hint_follow, "follow"):
            return None
        assessed = [await self.assess(facts, text) for text in shown]
        counts: dict[Hashable, int] = {}
        for item in assessed:
            counts[item.key] = counts.get(item.key, 0) + 1
        top = max(counts.values())
        chosen = next(item for item in assessed if counts[item.key] == top)
        if not chosen.answer and not chosen.correct:
            return None  # nothing usable was shown
        return chosen

    # --- judging shown solutions -----------------------------------------------------------

    async def assess(self, facts: ProblemFacts, text: str) -> Assessment:
        """What ``text`` answers to ``facts``'s problem and whether it is right."""
        if facts.task == "code":
            return await self._assess_code(facts, text)
        part = _answer_part(text)
        if facts.benchmark == "gsm8k" or (facts.task == "math" and facts.benchmark != "math"):
            return _assess_number(facts, part)
        if facts.task == "math":
            return _assess_math(facts, part)
        return _assess_qa(facts, part)

    async def _assess_code(self, facts: ProblemFacts, text: str) -> Assessment:
        code = _code_in(text, facts.problem.entry_point)
        if code.strip() == facts.answer.strip():
            return Assessment(self._code_key(code), True, code)
        verdict = await self.lab.verdict(facts.problem, code.strip())
        return Assessment(self._code_key(code), verdict.passes_hidden, code)

    def _code_key(self, code: str) -> Hashable:
        key = self._code_keys.get(code)
        if key is None:
            try:
                key = ast.dump(ast.parse(code))
            except (SyntaxError, ValueError, MemoryError, RecursionError):
                key = _SPACES.sub(" ", code.strip())
            if len(self._code_keys) > 50_000:
                self._code_keys.clear()
            self._code_keys[code] = key
        return key

    # --- other request kinds ---------------------------------------------------------------

    async def _choose(
        self, reading: Reading, facts: ProblemFacts, params: BenchmarkParams, s: _Sampler
    ) -> str:
        assessed = [await self.assess(facts, text) for text in reading.candidates]
        groups: dict[Hashable, list[int]] = {}
        for position, item in enumerate(assessed):
            groups.setdefault(item.key, []).append(position)
        problem = facts.problem

        def score(key: Hashable) -> float:
            members = groups[key]
            value = float(len(members))
            if reading.judge:
                value += params.judge_skill * assessed[members[0]].correct
                value += params.judge_bias * _draws.normal(
                    "preference",
                    self.calibration.seed,
                    problem.benchmark,
                    problem.problem_id,
                    repr(key),
                )
            return value + params.vote_noise * s.normal("vote", repr(key))

        best = max(groups, key=lambda k: (score(k), -groups[k][0]))
        members = groups[best]
        position = members[s.index(len(members), "member")]
        account = [
            (
                ", ".join(LETTERS[i] for i in idx),
                writing.describe(assessed[idx[0]].answer or "no answer"),
            )
            for idx in groups.values()
        ]
        return writing.choice_reply(reading, LETTERS[position], account)

    async def _review(
        self, reading: Reading, facts: ProblemFacts, params: BenchmarkParams, s: _Sampler
    ) -> str:
        shown = await self.assess(facts, reading.solution or "")
        if shown.correct:
            passed = not s.chance(params.review_false_reject, "reject")
        else:
            passed = not s.chance(params.review_detect, "detect")
        return writing.review_reply(reading, passed, facts.task, shown.correct, s.pick)

    async def _revise(
        self, reading: Reading, facts: ProblemFacts, params: BenchmarkParams, s: _Sampler
    ) -> str:
        shown = await self.assess(facts, reading.solution or "")
        if shown.correct:
            right = not s.chance(params.revise_break, "break")
        else:
            right = s.chance(params.revise_fix, "fix")
        keep = not shown.correct and bool(shown.answer) and s.chance(KEEP_WRONG, "keep")
        if facts.task == "code":
            if right:
                code = facts.answer
            elif keep:
                code = shown.answer
            else:
                code = await self._wrong_code(facts, params, s, avoid=shown.answer)
            return writing.revised(reading, writing.fenced(code))
        answer = (
            facts.answer
            if right
            else (shown.answer if keep else self._wrong_text(facts, params, s))
        )
        if facts.task == "math":
            plain = Reading("answer", reading.match, "", step_by_step=True, boxed=reading.boxed)
            return writing.revised(
                reading, writing.math_answer(facts, plain, answer, right, s.pick)
            )
        return writing.revised(reading, writing.wordy(facts, answer, s.pick))

    async def _test_fix(
        self, reading: Reading, facts: ProblemFacts, params: BenchmarkParams, s: _Sampler
    ) -> str:
        shown = await self.assess(facts, reading.solution or "")
        if shown.correct:
            code = shown.answer
        elif s.chance(params.test_fix, "fix"):
            code = facts.answer
        else:
            code = await self._wrong_code(facts, params, s, avoid=shown.answer)
        note = (
            "The failing tests point to a bug in how the function handles these inputs. "
            "Here is the corrected function:"
        )
        return f"{note}\n\n{writing.fenced(code)}"

    async def _format(
        self, reading: Reading, facts: ProblemFacts, params: BenchmarkParams, s: _Sampler
    ) -> str:
        if reading.discard is not None:
            return writing.formatted(reading, writing.discarded(reading, facts, s.pick, s.uniform))
        shown = await self.assess(facts, reading.solution or "")
        if shown.correct:
            answer = facts.answer
            if facts.task == "qa" and s.chance(params.imprecise_extracted, "imprecise"):
                answer = writing.imprecise(facts, answer, s.pick)
        else:
            answer = shown.answer or _last_line(reading.solution or "")
        return writing.formatted(reading, answer)


# --- assessing text answers ------------------------------------------------------------------


def _answer_part(text: str) -> str:
    """The part of a reply that holds its answer: an ``<answer>`` or ``<solution>`` tag."""
    for tag in ("answer", "solution"):
        if f"<{tag}>" in text:
            found = _TAG[tag].findall(text)
            if found and found[-1].strip():
                return str(found[-1]).strip()
    return text


def _assess_number(facts: ProblemFacts, part: str) -> Assessment:
    value = extract_number(part)
    if value is None:
        return Assessment(("none",), False, "")
    gold = extract_number(facts.answer)
    correct = gold is not None and abs(value - gold) <= 1e-6
    return Assessment(("number", round(value, 6)), correct, format_number(value))


def normalize_math(answer: str) -> str:
    """A light normal form of a LaTeX answer (spacing, sizing and fraction macros)."""
    text = _LATEX_NOISE.sub("", answer)
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = text.replace("^\\circ", "").replace("^{\\circ}", "")
    text = _SPACES.sub("", text).rstrip(".")
    return text


def _assess_math(facts: ProblemFacts, part: str) -> Assessment:
    extracted = extract_model_answer(part)
    if not extracted:
        return Assessment(("none",), False, "")
    norm = normalize_math(extracted)
    gold = normalize_math(facts.answer)
    correct = norm == gold
    if not correct:
        mine, theirs = parse_digits(norm), parse_digits(gold)
        if mine is not None and theirs is not None:
            correct = math.isclose(mine, theirs, abs_tol=1e-3)
    return Assessment(("gold",) if correct else ("math", norm), correct, extracted)


_QA_WORD = re.compile(r"\w+")


def _tokens(text: str) -> list[str]:
    return [w for w in _QA_WORD.findall(text.lower()) if w not in ("a", "an", "the")]


def _contains(haystack: list[str], needle: list[str]) -> bool:
    if not needle or len(needle) > len(haystack):
        return False
    width = len(needle)
    return any(haystack[i : i + width] == needle for i in range(len(haystack) - width + 1))


_ECHO_SHARE = 0.9
"""Share of the problem's words a text must repeat to count as the problem given back."""


def _echoes(words: list[str], facts: ProblemFacts) -> bool:
    """Whether ``words`` mostly repeat the problem statement (a passage copied back holds
    every answer and commits to none)."""
    if len(words) < 20:
        return False
    question = _statement_words(facts.problem.question)
    return bool(question) and len(question & set(words)) >= _ECHO_SHARE * len(question)


@functools.lru_cache(maxsize=8192)
def _statement_words(question: str) -> frozenset[str]:
    return frozenset(_tokens(question))


def _assess_qa(facts: ProblemFacts, part: str) -> Assessment:
    benchmark = get_benchmark(facts.benchmark)
    scorer = benchmark if isinstance(benchmark, TextBenchmark) else get_benchmark("hotpotqa")
    words = _tokens(part)
    if _echoes(words, facts):
        return Assessment(("echo",), False, "")
    golds = [g for g in facts.problem.gold.split("|") if g.strip()] or [facts.answer]
    for wrong in facts.wrong:
        wrong_words = _tokens(wrong)
        names_it = words == wrong_words or (len(words) <= 8 and _contains(words, wrong_words))
        if wrong_words and names_it and not any(_contains(words, _tokens(g)) for g in golds):
            return Assessment(("wrong", wrong), False, wrong)
    if scorer.score_answer(part, facts.problem.gold) >= 0.5 or any(
        _contains(words, _tokens(g)) for g in golds
    ):
        return Assessment(("gold",), True, facts.answer)
    short = " ".join(part.split()[:8])
    return Assessment(("text", " ".join(words[:8])), False, short)


def _code_in(text: str, entry_point: str | None) -> str:
    """The code of a reply: the fenced block defining ``entry_point``, else the last block,
    else the text itself."""
    blocks = _FENCE.findall(text)
    if not blocks:
        return text.strip()
    if entry_point:
        defining = [b for b in blocks if re.search(rf"\bdef\s+{re.escape(entry_point)}\s*\(", b)]
        if defining:
            return str(defining[-1]).strip()
    return str(blocks[-1]).strip()


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


# --- requests about no known problem -----------------------------------------------------------

_ANY_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _generic(reading: Reading, s: _Sampler) -> str:
    """A plausible reply in the requested form when the problem is unknown."""
    numbers = _ANY_NUMBER.findall(reading.instruction)
    guess = numbers[-1] if numbers else "I cannot tell from the information given"
    if reading.kind == "choose":
        letter = LETTERS[s.index(len(reading.candidates), "letter")]
        return writing.choice_reply(reading, letter, [])
    if reading.kind == "review":
        return writing.review_reply(reading, True, "math", True, s.pick)
    if reading.kind in ("revise", "test_fix"):
        return writing.revised(reading, (reading.solution or "").strip())
    if reading.kind == "format":
        return writing.formatted(reading, _last_line(reading.solution or "") or guess)
    if reading.kind in ("program", "program_fix"):
        return writing.program(None, guess, False, s.pick)
    if reading.kind == "code":
        name = reading.entry_point or "solution"
        body = f"def {name}(*args):\n    # The task leaves the behaviour open.\n    return None"
        return writing.code_answer(reading, body, None)
    if "answer" in reading.tags:
        return (
            f"<thought>Working from what the question states.</thought>\n<answer>{guess}</answer>"
        )
    return f"Working from what the question states, the answer is {guess}."
