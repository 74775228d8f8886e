"""Writing the surrogate's replies: the decided answer in the form the prompt asked for.

The model (:mod:`aflowrl.executor.surrogate.model`) decides *what* to answer (right or which
wrong answer, which letter, which verdict); these functions decide *how* it reads: worked
reasoning then the answer (GSM8K's worked solution, MATH's solution text), tags when the prompt
asks for them (``<thought>``/``<answer>``, ``<review_result>``/``<feedback>``,
``<solution_letter>``, ``<solution>``), ``\\boxed{}`` when asked (and on MATH, as models trained
on it do), code in one fenced block, ``solve()`` programs. QA answers come in three registers,
because token F1 scores the words as well as the answer: the bare answer, an imprecise one (a
word of the passage too many, or one too few) and a wordy one (a sentence around the answer).

``Pick`` is the caller's random choice among phrasings (an index in ``range(n)``).
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Sequence

from aflowrl.executor.surrogate.facts import ProblemFacts, format_number
from aflowrl.executor.surrogate.reading import Reading

Pick = Callable[[int, str], int]
"""``pick(n, what)``: which of ``n`` phrasings to use for ``what``."""

_BOXED = re.compile(r"\\boxed\s*\{")
_HOW_MANY = re.compile(r"\bhow many ([a-z]+)", re.IGNORECASE)


def fenced(code: str) -> str:
    return f"```python\n{code.strip()}\n```"


def _tagged(reading: Reading, tag: str, content: str) -> str:
    return f"<{tag}>{content}</{tag}>" if tag in reading.tags else content


def _unbox(text: str) -> str:
    """``text`` with every ``\\boxed{X}`` replaced by ``X`` (so only the final box counts)."""
    out: list[str] = []
    position = 0
    for found in _BOXED.finditer(text):
        if found.start() < position:
            continue
        depth, end = 1, found.end()
        while end < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        out.append(text[position : found.start()])
        out.append(text[found.end() : end - 1])
        position = end
    out.append(text[position:])
    return "".join(out)


# --- math ----------------------------------------------------------------------------------


def math_reasoning(facts: ProblemFacts, answer: str, correct: bool, pick: Pick) -> str:
    """Worked reasoning that arrives at ``answer``: the reference reasoning when right; when
    wrong, its first part and a slip that leads to ``answer``."""
    reasoning = facts.reasoning.strip()
    if not reasoning:
        reasoning = "Let me set up the problem and compute step by step."
    if correct:
        return reasoning
    lines = [line for line in reasoning.splitlines() if line.strip()]
    if len(lines) > 1:
        kept = lines[: max(1, len(lines) - 1 - pick(2, "cut"))]
    else:
        sentences = re.split(r"(?<=[.!?])\s+", reasoning)
        kept = sentences[: max(1, len(sentences) // 2)]
    slip = (
        "Combining these results",
        "Putting this together",
        "Carrying the computation through",
    )[pick(3, "slip")]
    return _unbox("\n".join(kept)).strip() + f"\n{slip}, we get {answer}."


def math_answer(
    facts: ProblemFacts, reading: Reading, answer: str, correct: bool, pick: Pick
) -> str:
    """A math reply: reasoning (unless only the answer is wanted) and the final answer."""
    boxed = reading.boxed or facts.benchmark == "math"
    final = f"\\boxed{{{answer}}}" if boxed else answer
    if "answer" in reading.tags:
        thought = "" if reading.answer_only else math_reasoning(facts, answer, correct, pick)
        head = f"<thought>{_unbox(thought)}</thought>\n" if thought else ""
        return f"{head}<answer>{answer}</answer>"
    if reading.answer_only:
        return f"{final}" if boxed else f"The answer is {answer}."
    reasoning = math_reasoning(facts, answer, correct, pick)
    if correct and boxed and _BOXED.search(reasoning):
        return reasoning
    closing = ("The answer is", "Therefore, the final answer is", "So the answer is")[
        pick(3, "closing")
    ]
    return f"{_unbox(reasoning)}\n\n{closing} {final}."


def program(facts: ProblemFacts | None, answer: str, crash: bool, pick: Pick) -> str:
    """A ``solve()`` program returning ``answer`` (GSM8K: it spells out the worked solution's
    calculations and returns the step that gives ``answer``, so, as with a real program, its
    text does not state the result: only running it does); with ``crash`` it has a bug that
    raises before returning."""
    lines = ["def solve():"]
    question = facts.problem.question.strip().splitlines()[0] if facts is not None else ""
    if question:
        lines.append(f"    # {question[:90]}")
    steps = facts.steps if facts is not None else ()
    computed: dict[float, str] = {}
    for number, (expression, _) in enumerate(steps, start=1):
        if re.fullmatch(r"[\d\s.+\-*/()]+", expression) and expression.strip():
            lines.append(f"    step_{number} = {expression.strip()}")
            value = _arithmetic(expression)
            if value is not None:
                computed[value] = f"step_{number}"
    if crash:
        bug = (
            "    per_item = total_amount / item_count",
            "    ratio = step_1 / 0",
            "    values = [1, 2, 3]\n    last = values[3]",
        )[pick(3, "bug")]
        lines.append(bug)
    numeric = re.fullmatch(r"-?\d+(\.\d+)?", answer) is not None
    expression = _computed(float(answer), computed) if numeric else repr(answer)
    lines.append(f"    answer = {expression}")
    lines.append("    return answer")
    return fenced("\n".join(lines))


_OPERATORS: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _computed(value: float, steps: dict[float, str]) -> str:
    """An expression of the program's steps that evaluates to ``value``: the step that gives it,
    else the last step plus the difference, else a sum of two numbers. A real program computes
    its result; its text does not state it."""
    if value in steps:
        name = steps[value]
    elif steps:
        last_value, last_name = list(steps.items())[-1]
        difference = round(value - last_value, 6)
        sign = "+" if difference >= 0 else "-"
        name = f"{last_name} {sign} {format_number(abs(difference))}"
    else:
        part = float(int(value) // 2) if value.is_integer() else round(value / 2, 2)
        name = f"{format_number(value - part)} + {format_number(part)}"
    return f"round({name})" if value.is_integer() else f"round({name}, 6)"


def _arithmetic(expression: str) -> float | None:
    """The value of a worked solution's calculator expression (numbers, + - * / and
    parentheses; None for anything else or a division by zero), rounded to 6 decimals."""
    try:
        tree = ast.parse(expression.strip(), mode="eval").body
    except SyntaxError:
        return None

    def value(node: ast.expr) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError("not arithmetic")

    try:
        return round(value(tree), 6)
    except (ArithmeticError, ValueError, RecursionError):
        return None


# --- discarding the problem ------------------------------------------------------------------

_NEGLECT_REPLIES = (
    "As instructed, I have set the question aside and will not address it.",
    "Understood. I will leave the problem alone.",
)
_OTHER_REPLIES = (
    "Here is something else, as asked: the evening tide rolled over the quiet harbour stones.",
    "Switching to the other request: a short verse about rain on a tin roof.",
)


def discarded(
    reading: Reading, facts: ProblemFacts, pick: Pick, draw: Callable[[str], float]
) -> str:
    """The reply to an instruction that does not let the problem be addressed: what the
    instruction asked for instead (a constant, nothing, a made-up number, the problem given
    back, some other work), as a model that follows it would write it."""
    code = facts.task == "code"
    value: str
    if reading.discard == "constant":
        value = _constant_value(reading.literal, code)
    elif reading.discard == "random":
        number = int(draw("discard-random") * 1000)
        value = f"return {number}" if code else str(number)
    elif reading.discard == "empty":
        return ""
    elif reading.discard == "echo":
        return facts.problem.question.strip()
    elif reading.discard == "other":
        return _OTHER_REPLIES[pick(len(_OTHER_REPLIES), "other")]
    else:
        return _NEGLECT_REPLIES[pick(len(_NEGLECT_REPLIES), "neglect")]
    if not code:
        return value
    name = facts.problem.entry_point or "solution"
    return fenced(f"def {name}(*args, **kwargs):\n    {value}")


_PYTHON_LITERALS = {"none": "None", "null": "None", "nil": "None", "true": "True", "false": "False"}


def _constant_value(literal: str | None, code: bool) -> str:
    """The constant as the reply gives it: a function body for code, a value otherwise."""
    text = (literal or ("pass" if code else "0")).strip()
    low = text.lower()
    if low.startswith(("return", "raise", "pass", "...")):
        if code:
            return re.sub(r"\b(none|true|false)\b", lambda m: _PYTHON_LITERALS[m.group(1)], text)
        returned = low.removeprefix("return").strip()
        return _PYTHON_LITERALS.get(returned, returned)
    if code:
        number = re.fullmatch(r"-?\d+(?:\.\d+)?", low)
        value = low if number else _PYTHON_LITERALS.get(low, repr(text))
        return f"return {value}"
    return _PYTHON_LITERALS.get(low, text)


# --- QA ------------------------------------------------------------------------------------


def imprecise(facts: ProblemFacts, answer: str, pick: Pick) -> str:
    """``answer`` with a word of the passage too many (or, for long answers, one too few)."""
    words = answer.split()
    if len(words) > 2 and pick(3, "trim") == 0:
        return " ".join(words[1:] if pick(2, "side") else words[:-1])
    before, after = [], []
    if "|" in facts.context_words:
        split = facts.context_words.index("|")
        before = list(facts.context_words[:split])
        after = list(facts.context_words[split + 1 :])
    if before and (not after or pick(2, "around") == 0):
        return f"{before[-1]} {answer}"
    if after:
        return f"{answer} {after[0]}"
    unit = _HOW_MANY.search(facts.problem.question)
    if unit is not None:
        return f"{answer} {unit.group(1)}"
    return f"about {answer}"


def wordy(facts: ProblemFacts | None, answer: str, pick: Pick) -> str:
    """A sentence that contains ``answer`` and more words than needed."""
    sentence = facts.reasoning.strip() if facts is not None else ""
    templates = [
        f"The answer is {answer}.",
        f"{answer}, according to the passage.",
        f"Based on the information given, the answer is {answer}.",
        f"{answer}. This follows from the details provided in the context.",
    ]
    if sentence and answer.lower() in sentence.lower() and len(sentence) < 400:
        templates.append(f'{answer}. The passage states: "{sentence}"')
    return templates[pick(len(templates), "wordy")]


def qa_reasoning(facts: ProblemFacts, answer: str) -> str:
    sentence = facts.reasoning.strip()
    if sentence and answer.lower() in sentence.lower():
        return f"The relevant passage says: {sentence} So the answer is {answer}."
    return f"Reading the context and connecting the relevant facts, the answer is {answer}."


def qa_answer(facts: ProblemFacts, reading: Reading, short: str, wordy_text: str | None) -> str:
    """A QA reply: tagged thought and answer; reasoning then the answer when asked to reason
    (all of it is scored); else the short answer, or ``wordy_text`` when given."""
    if "answer" in reading.tags:
        thought = "" if reading.answer_only else qa_reasoning(facts, short)
        head = f"<thought>{thought}</thought>\n" if thought else ""
        return f"{head}<answer>{short}</answer>"
    if reading.step_by_step:  # the reasoning is written out, however briefly the answer ends
        return f"{qa_reasoning(facts, short)}\nFinal answer: {short}"
    return wordy_text if wordy_text is not None else short


# --- code ----------------------------------------------------------------------------------


def code_answer(reading: Reading, code: str, facts: ProblemFacts | None) -> str:
    """Code in one fenced block; a short plan first when asked to think it through."""
    if not reading.step_by_step:
        return fenced(code)
    first = ""
    if facts is not None:
        question = facts.problem.question
        quoted = re.search(r'(?:"""|\'\'\')(.*?)(?:"""|\'\'\'|$)', question, re.DOTALL)
        text = re.sub(r"\s+", " ", quoted.group(1) if quoted else question)
        found = re.search(r"[A-Z][^.>]{10,200}[.]", text)
        first = found.group(0) if found else ""
    plan = (
        f"Plan: {first} I handle the edge cases first, then implement the main loop."
        if first
        else "Plan: handle the edge cases first, then implement the main logic."
    )
    return f"{plan}\n\n{fenced(code)}"


# --- review, choice, revision, extraction --------------------------------------------------

_PASS_FEEDBACK = (
    "The reasoning is sound and the final result answers the question.",
    "Each step follows from the previous one, and the result fits what the problem asks.",
)
_FAIL_FEEDBACK = {
    "math": (
        "One of the calculations is wrong, so the final result does not hold; redo the "
        "arithmetic of the last steps carefully.",
        "The solution misreads a condition of the problem; recompute with every quantity "
        "taken into account.",
    ),
    "qa": (
        "The answer does not match what the context supports; re-read the relevant sentences "
        "and connect the two facts correctly.",
        "The answer names the wrong entity; check which one the question actually asks about.",
    ),
    "code": (
        "The function mishandles some inputs (an edge case or a boundary); trace the examples "
        "and fix the condition.",
        "The logic is off by one in a loop or comparison; check the boundaries against the "
        "examples.",
    ),
}
_NITPICKS = (
    "The final step is not justified clearly enough; verify it before trusting the result.",
    "Some steps are skipped, so the result cannot be confirmed; recheck the intermediate values.",
)


def review_reply(reading: Reading, passed: bool, task: str, right: bool, pick: Pick) -> str:
    """A verdict with feedback (a nitpick when a right solution is rejected)."""
    if passed:
        feedback = _PASS_FEEDBACK[pick(2, "feedback")]
    elif right:
        feedback = _NITPICKS[pick(2, "feedback")]
    else:
        feedback = _FAIL_FEEDBACK.get(task, _FAIL_FEEDBACK["math"])[pick(2, "feedback")]
    verdict = "true" if passed else "false"
    if "review_result" in reading.tags or "feedback" in reading.tags:
        return f"<review_result>{verdict}</review_result>\n<feedback>{feedback}</feedback>"
    word = "correct" if passed else "incorrect"
    return f"Verdict: {word}\nFeedback: {feedback}"


def choice_reply(reading: Reading, letter: str, groups: Sequence[tuple[str, str]]) -> str:
    """The chosen letter, with a short account of which candidates agree (``groups``: letters
    and a description of their answer)."""
    account = "; ".join(f"{letters} give {what}" for letters, what in groups[:6])
    thought = f"{account}. Candidate {letter} is the most reliable." if account else ""
    if "solution_letter" in reading.tags:
        head = f"<thought>{thought}</thought>\n" if "thought" in reading.tags else ""
        return f"{head}<solution_letter>{letter}</solution_letter>"
    return f"{thought}\nMy choice is candidate {letter}.".strip()


def revised(reading: Reading, content: str) -> str:
    return _tagged(reading, "solution", content)


def formatted(reading: Reading, answer: str) -> str:
    return _tagged(reading, "answer", answer)


def describe(answer: str, limit: int = 40) -> str:
    """A short description of an answer for a choice's account."""
    text = " ".join(answer.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
