"""Instruction prompts the admissible actions offer, per task type and role (our own words).

The policy can write any prompt in text mode (``set_prompt <node> "..."``), but choice mode
needs an enumerable list, so each role has a few distinct rewrites, each changing one thing
about what the model is asked to do (reason step by step, check the result, plan first, be
concise...), in the spirit of AFlow's one-detail modifications:

* ``generate``: the instruction of a generating node (Custom, CustomCodeGenerate);
* ``plan``: a preparatory step on the problem whose result a generator also reads;
* ``refine``: a Custom step after a solution that improves it;
* ``format``: the instruction of a final Format step.

Used by :mod:`aflowrl.search.edits` when it enumerates admissible actions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

from aflowrl.benchmarks.base import TaskType

Role = Literal["generate", "plan", "refine", "format"]

PROMPTS: Final[Mapping[TaskType, Mapping[Role, tuple[str, ...]]]] = {
    "math": {
        "generate": (
            "Solve the following math problem step by step. Explain each step of your "
            "reasoning, then write the final answer in \\boxed{} at the end.",
            "Solve the problem step by step. Then verify the result by checking it against "
            "every condition of the problem; if the check fails, correct the solution. Write "
            "the final answer in \\boxed{}.",
            "First list the given quantities and what is asked. Then plan the solution, carry "
            "it out step by step with careful arithmetic, and write the final answer in "
            "\\boxed{}.",
            "Solve the problem. Keep the reasoning short and precise, double-check every "
            "calculation, and write only the final answer in \\boxed{} on the last line.",
        ),
        "plan": (
            "Analyse the problem: state what is asked, the given quantities, and a step-by-step "
            "plan to solve it. Do not solve it yet.",
            "Name the mathematical concepts and formulas this problem needs, and the pitfalls "
            "to avoid. Do not solve it yet.",
        ),
        "refine": (
            "Check the solution above step by step for errors in reasoning or arithmetic. If "
            "you find one, solve the problem again correctly; otherwise keep the solution. "
            "Write the final answer in \\boxed{}.",
            "Solve the problem again independently, step by step, and compare with the "
            "solution above. Give the answer you are most confident in, in \\boxed{}.",
        ),
        "format": (
            "Give only the final numeric or symbolic answer, simplified, with no units or words.",
        ),
    },
    "qa": {
        "generate": (
            "Read the context carefully and answer the question. Think step by step about "
            "which facts are needed, then give a concise final answer (an entity, a short "
            "phrase or a number).",
            "Find the sentences of the context that answer the question, combine the facts "
            "they give, and answer with the shortest phrase that is correct.",
            "Answer the question from the context. If it needs several facts, connect them "
            "one hop at a time. Reply with the answer only: no explanation.",
        ),
        "plan": (
            "List the facts from the context that are needed to answer the question, with "
            "the sentence each comes from. Do not answer yet.",
            "Break the question into simpler sub-questions and answer each from the context.",
        ),
        "refine": (
            "Check the answer above against the context: is every fact it relies on stated "
            "there? Correct it if needed and reply with the final answer only.",
            "Shorten the answer above to the exact entity, number or phrase the question asks "
            "for, as it appears in the context.",
        ),
        "format": (
            "Give only the answer span: an entity, a number or a short phrase, copied from "
            "the context where possible.",
        ),
    },
    "code": {
        "generate": (
            "Think step by step: restate what the function must do, work through the "
            "examples and edge cases, plan the algorithm, and only then write the code.",
            "Write a correct and simple Python function for the problem. Handle edge cases "
            "(empty inputs, zeros, negative numbers, duplicates) and check it against the "
            "examples in the docstring before answering.",
            "Write the function, then trace it by hand on each example of the problem; if any "
            "result differs from the expected one, fix the code. Give the final complete "
            "function in one ```python code block.",
        ),
        "plan": (
            "Analyse the problem: restate the function's contract, list edge cases and the "
            "examples' expected outputs, and outline an algorithm. Do not write code yet.",
            "Write a few extra test cases (inputs and expected outputs) for this function, "
            "including edge cases. Do not write the function.",
        ),
        "refine": (
            "Review the code above for bugs and unhandled edge cases against the problem "
            "statement and its examples. Reply with the complete corrected function in one "
            "```python code block (unchanged if it is correct).",
        ),
        "format": (),
    },
}
"""Prompt rewrites by task type and role."""


def prompts_for(task_type: TaskType, role: Role) -> tuple[str, ...]:
    """The prompt rewrites of ``role`` for ``task_type`` workflows."""
    return PROMPTS[task_type][role]
