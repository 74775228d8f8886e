"""The operators at run time: build the prompt, call the executor, parse, run code.

:func:`run_node` executes one node given its input values and returns its value: a solution
(``str``), candidates (``tuple[str, ...]``) or a :class:`~aflowrl.workflow.runtime.Verdict`.
Called by the interpreter only.

Failure rules, the same for every operator:

* output that cannot be parsed raises :class:`OperatorOutputError` (the problem scores 0, the
  run is logged, the evaluation goes on); in a fan-out or a vote, unusable samples are dropped
  and the node fails only when none is usable;
* a Programmer program that keeps failing yields the failure text, as AFlow's operator does, so
  later nodes can still answer;
* executor and sandbox infrastructure errors propagate: they are not wrong answers.

Draws (:meth:`~aflowrl.workflow.runtime.RunContext.draw`): each fan-out sample and each
MedPrompt vote is one draw, and every other operator's node is one draw, so a draw a parent
workflow already made on the same input texts is reused instead of paid for again. A draw
depends only on its inputs' values, the problem, its seeds and its own parameters (never on how
many siblings it has, nor on what produced its inputs), which is what makes reusing it exact.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence

from aflowrl.seeding import derive_seed
from aflowrl.workflow import harness, parsing, prompts
from aflowrl.workflow.errors import OperatorOutputError
from aflowrl.workflow.graph import Node
from aflowrl.workflow.ops import PROBLEM
from aflowrl.workflow.runtime import RunContext, Value, Verdict

logger = logging.getLogger(__name__)


def _fail(node: Node, reason: str) -> OperatorOutputError:
    return OperatorOutputError(node.id, node.op, reason)


def _texts(value: Value) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, tuple):
        return value
    raise TypeError("a verdict is not text")  # the validator prevents this


def _one(node: Node, values: Mapping[str, Value], slot: str) -> str:
    value = values[node.inputs[slot][0]]
    if not isinstance(value, str):  # the validator prevents this
        raise TypeError(f"{node.id}.{slot} expects one solution")
    return value


def _context(ctx: RunContext, node: Node, values: Mapping[str, Value], slot: str) -> str:
    """The texts a generating node reads, in order: the problem, notes, candidate pools."""
    parts: list[str] = []
    for ref in node.inputs.get(slot, ()):
        if ref == PROBLEM:
            parts.append(ctx.question.strip())
            continue
        value = values[ref]
        if isinstance(value, str):
            parts.append(prompts.note_block(value))
        elif isinstance(value, tuple):
            parts.append(prompts.pool_block(value))
    return "\n\n".join(parts)


def _pool(node: Node, values: Mapping[str, Value]) -> list[str]:
    return [text for ref in node.inputs["solutions"] for text in _texts(values[ref])]


async def _fan_out(
    ctx: RunContext, node: Node, sample: Callable[[int], Awaitable[str | None]]
) -> tuple[str, ...]:
    """Draw ``node.samples`` samples concurrently; drop unusable ones (None)."""

    async def draw(i: int) -> str | None:
        value = await ctx.draw(node, i, lambda: sample(i))
        if value is not None and not isinstance(value, str):  # the encoding prevents this
            raise TypeError(f"sample {i} of {node.id!r} gave {type(value).__name__}")
        return value

    results = await asyncio.gather(*(draw(i) for i in range(node.samples)))
    usable = tuple(r for r in results if r is not None)
    if not usable:
        raise _fail(node, f"none of its {node.samples} samples gave usable output")
    return usable


def _as_value(node: Node, samples: tuple[str, ...]) -> Value:
    return samples[0] if node.samples == 1 else samples


async def _parsed_call(
    ctx: RunContext, node: Node, sample: int, prompt: str, parse: Callable[[str], str]
) -> str | None:
    """One call whose output goes through ``parse``; None (traced and logged) if it fails."""
    text, event = await ctx.llm(node, sample, prompt)
    try:
        parsed = parse(text)
    except parsing.ParseFailure as exc:
        ctx.record(event, error=str(exc))
        logger.info("node %r (%s) sample %d: unusable output: %s", node.id, node.op, sample, exc)
        return None
    ctx.record(event, parsed=parsed)
    return parsed


def _entry_point(ctx: RunContext, node: Node) -> str:
    if not ctx.entry_point:
        raise _fail(node, "the problem names no entry point (function) for code")
    return ctx.entry_point


def code_of(text: str, entry_point: str) -> str:
    """Clean Python code defining ``entry_point`` from a reply (raises ``ParseFailure``)."""
    return parsing.sanitize_code(parsing.extract_code(text, entry_point), entry_point)


async def _custom(ctx: RunContext, node: Node, values: Mapping[str, Value]) -> Value:
    prompt = prompts.custom(ctx.prompt_text(node.instruction), _context(ctx, node, values, "input"))

    async def sample(i: int) -> str:
        text, _ = await ctx.llm(node, i, prompt)
        return text

    return _as_value(node, await _fan_out(ctx, node, sample))


async def _answer_generate(ctx: RunContext, node: Node, values: Mapping[str, Value]) -> Value:
    prompt = prompts.answer_generate(_context(ctx, node, values, "input"))
    return _as_value(
        node,
        await _fan_out(
            ctx, node, lambda i: _parsed_call(ctx, node, i, prompt, parsing.parse_answer)
        ),
    )


async def _code_generate(ctx: RunContext, node: Node, values: Mapping[str, Value]) -> Value:
    entry_point = _entry_point(ctx, node)
    prompt = prompts.code_generate(
        ctx.prompt_text(node.instruction), _context(ctx, node, values, "input"), entry_point
    )
    return _as_value(
        node,
        await _fan_out(
            ctx,
            node,
            lambda i: _parsed_call(ctx, node, i, prompt, lambda t: code_of(t, entry_point)),
        ),
    )


async def _programmer(ctx: RunContext, node: Node, values: Mapping[str, Value]) -> Value:
    context = _context(ctx, node, values, "input")
    analysis = _context(ctx, node, values, "analysis") or None
    attempts = int(getattr(node.params, "max_attempts", 3))

    async def sample(i: int) -> str:
        failure: tuple[str, str] | None = None
        for _ in range(attempts):
            prompt = prompts.programmer(context, analysis, failure)
            text, event = await ctx.llm(node, i, prompt)
            try:
                code = code_of(text, "solve")
            except parsing.ParseFailure as exc:
                ctx.record(event, error=str(exc))
                failure = (text[-1500:], f"No usable program: {exc}.")
                continue
            ctx.record(event, parsed=code)
            marker = harness.new_marker()
            result = await ctx.run_code(node, i, harness.program_script(code, marker), "solve()")
            output = harness.read_program_output(result.stdout, marker)
            if result.status == "ok" and output is not None:
                return output
            error = {
                "timeout": "The program did not finish in time.",
                "killed": f"The program was killed ({result.reason or 'resource limit'}).",
            }.get(result.status, result.stderr.strip()[-1500:] or "solve() did not return")
            failure = (code, error)
        assert failure is not None
        logger.info("node %r (Programmer) sample %d: every attempt failed", node.id, i)
        return f"The program failed after {attempts} attempts: {failure[1][-500:]}"

    return _as_value(node, await _fan_out(ctx, node, sample))


async def _ensemble_vote(
    ctx: RunContext, node: Node, vote: int, pool: Sequence[str], shuffle: bool
) -> int | None:
    """One vote over the pool (shuffled for MdEnsemble); the original index chosen, or None."""
    order = list(range(len(pool)))
    if shuffle:
        random.Random(derive_seed(ctx.seed, ctx.position(node), "shuffle", vote)).shuffle(order)
    shown = [pool[i] for i in order]
    build = prompts.md_ensemble if shuffle else prompts.sc_ensemble
    text, event = await ctx.llm(node, vote, build(ctx.question, shown))
    try:
        position = parsing.parse_letter(text, len(shown))
    except parsing.ParseFailure as exc:
        ctx.record(event, error=str(exc))
        logger.info("node %r (%s) vote %d: %s", node.id, node.op, vote, exc)
        return None
    ctx.record(event, parsed=prompts.label(position))
    return order[position]


async def _sc_ensemble(ctx: RunContext, node: Node, values: Mapping[str, Value]) -> Value:
    pool = _pool(node, values)
    if len(pool) == 1:
        return pool[0]
    choice = await _ensemble_vote(ctx, node, 0, pool, shuffle=False)
    if choice is None:
        raise _fail(node, "no candidate letter in the output")
    return pool[choice]


async def _md_ensemble(ctx: RunContext, node: Node, values: Mapping[str, Value]) -> Value:
    pool = _pool(node, values)
    if len(pool) == 1:
        return pool[0]
    votes = int(getattr(node.params, "votes", 5))

    async def vote(v: int) -> int | None:
        choice = await ctx.draw(node, v, lambda: _ensemble_vote(ctx, node, v, pool, shuffle=True))
        if choice is not None and (isinstance(choice, bool) or not isinstance(choice, int)):
            raise TypeError(f"vote {v} of {node.id!r} gave {type(choice).__name__}")
        return choice

    chosen = await asyncio.gather(*(vote(v) for v in range(votes)))
    counts = Counter(c for c in chosen if c is not None)
    if not counts:
        raise _fail(node, f"none of its {votes} votes named a candidate")
    # Most votes wins; a tie goes to the candidate listed first.
    best = max(counts, key=lambda i: (counts[i], -i))
    return pool[best]


async def _review_once(ctx: RunContext, node: Node, solution: str) -> Verdict:
    text, event = await ctx.llm(node, 0, prompts.review(ctx.question, solution, ctx.task_type))
    try:
        passed, feedback = parsing.parse_verdict(text)
    except parsing.ParseFailure as exc:
        ctx.record(event, error=str(exc))
        raise _fail(node, str(exc)) from None
    ctx.record(event, parsed="pass" if passed else "fail")
    return Verdict(passed, feedback)


async def _revise_once(ctx: RunContext, node: Node, solution: str, feedback: str) -> str:
    prompt = prompts.revise(ctx.question, solution, feedback, ctx.task_type)
    revised = await _parsed_call(ctx, node, 0, prompt, parsing.parse_solution)
    if revised is None:
        raise _fail(node, "no revised solution in the output")
    return revised


async def _review(ctx: RunContext, node: Node, values: Mapping[str, Value]) -> Value:
    return await _review_once(ctx, node, _one(node, values, "solution"))


async def _revise(ctx: RunContext, node: Node, values: Mapping[str, Value]) -> Value:
    solution = _one(node, values, "solution")
    verdict = values[node.inputs["feedback"][0]]
    if not isinstance(verdict, Verdict):  # the validator prevents this
        raise TypeError(f"{node.id}.feedback expects a verdict")
    if verdict.passed:
        ctx.note(node, "review passed; solution kept")
        return solution
    return await _revise_once(ctx, node, solution, verdict.feedback)


async def _revise_loop(ctx: RunContext, node: Node, values: Mapping[str, Value]) -> Value:
    solution = _one(node, values, "solution")
    for _ in range(int(getattr(node.params, "max_rounds", 3))):
        verdict = await _review_once(ctx, node, solution)
        if verdict.passed:
            break
        solution = await _revise_once(ctx, node, solution, verdict.feedback)
    return solution


async def _run_public_tests(
    ctx: RunContext, node: Node, code: str, entry_point: str
) -> harness.PublicTestOutcome:
    # With no public tests known this still checks that the code loads and defines the function.
    tests = ctx.public_tests
    marker = harness.new_marker()
    script = harness.public_test_script(code, entry_point, tests, marker)
    result = await ctx.run_code(node, 0, script, f"{len(tests)} public tests")
    return harness.read_public_test_output(tests, result, marker)


async def _test(ctx: RunContext, node: Node, values: Mapping[str, Value]) -> Value:
    entry_point = _entry_point(ctx, node)
    try:
        code = code_of(_one(node, values, "solution"), entry_point)
    except parsing.ParseFailure as exc:
        raise _fail(node, f"nothing to test: {exc}") from None
    for _ in range(int(getattr(node.params, "max_rounds", 3))):
        outcome = await _run_public_tests(ctx, node, code, entry_point)
        if outcome.passed:
            return code
        prompt = prompts.test_fix(ctx.question, code, outcome.report, entry_point)
        fixed = await _parsed_call(ctx, node, 0, prompt, lambda t: code_of(t, entry_point))
        if fixed is not None:
            code = fixed
    return code


async def _format(ctx: RunContext, node: Node, values: Mapping[str, Value]) -> Value:
    prompt = prompts.format_answer(
        ctx.question, _one(node, values, "solution"), ctx.prompt_text(node.instruction)
    )
    answer = await _parsed_call(ctx, node, 0, prompt, parsing.parse_formatted)
    if answer is None:
        raise _fail(node, "no answer in the output")
    return answer


_Impl = Callable[[RunContext, Node, Mapping[str, Value]], Awaitable[Value]]

_IMPLS: Mapping[str, _Impl] = {
    "Custom": _custom,
    "AnswerGenerate": _answer_generate,
    "CustomCodeGenerate": _code_generate,
    "Programmer": _programmer,
    "ScEnsemble": _sc_ensemble,
    "MdEnsemble": _md_ensemble,
    "Review": _review,
    "Revise": _revise,
    "ReviseLoop": _revise_loop,
    "Test": _test,
    "Format": _format,
}


async def run_node(ctx: RunContext, node: Node, values: Mapping[str, Value]) -> Value:
    """Execute ``node`` on the values of its inputs (keyed by reference).

    Fan-out operators draw their samples or votes one by one; any other node is one draw.
    """
    impl = _IMPLS[node.op]
    ctx.bind_inputs(node, values)
    if node.spec.fan_out is not None:
        return await impl(ctx, node, values)
    value = await ctx.draw(node, None, lambda: impl(ctx, node, values))
    if value is None or isinstance(value, int):  # the encoding prevents this
        raise TypeError(f"node {node.id!r} gave {value!r}")
    return value
