"""Reading requests: what each operator's prompt asks for, and paraphrases of it."""

from __future__ import annotations

import pytest

from aflowrl.executor.surrogate import ProblemIndex, read_request
from aflowrl.workflow import prompts


@pytest.fixture(scope="module")
def index(all_problems):
    return ProblemIndex(all_problems)


def _first(all_problems, benchmark):
    return next(p for p in all_problems if p.benchmark == benchmark)


def test_the_operators_prompts_are_read_as_their_operators(all_problems, index):
    math = _first(all_problems, "gsm8k")
    code = _first(all_problems, "humaneval")
    qa = _first(all_problems, "hotpotqa")
    cases = [
        (prompts.custom(None, math.question), "answer", {}),
        (
            prompts.custom("Solve the problem step by step.", math.question),
            "answer",
            {"step_by_step": True},
        ),
        (
            prompts.answer_generate(qa.question),
            "answer",
            {"step_by_step": True, "concise": True, "tags": {"thought", "answer"}},
        ),
        (prompts.code_generate(None, code.question, code.entry_point), "code", {}),
        (
            prompts.sc_ensemble(math.question, ["It is 3.", "It is 4.", "It is 3."]),
            "choose",
            {"judge": False},
        ),
        (prompts.md_ensemble(math.question, ["It is 3.", "It is 4."]), "choose", {"judge": True}),
        (prompts.programmer(math.question, None, None), "program", {}),
        (
            prompts.programmer(math.question, None, ("def solve():\n    return x", "NameError")),
            "program_fix",
            {},
        ),
        (
            prompts.test_fix(code.question, "def f():\n    pass", "0 of 1 passed", "f"),
            "test_fix",
            {},
        ),
        (prompts.review(math.question, "The answer is 3.", "math"), "review", {}),
        (prompts.revise(math.question, "It is 3.", "Recount.", "math"), "revise", {}),
        (prompts.format_answer(qa.question, "So it was Paris.", None), "format", {}),
    ]
    for prompt, kind, features in cases:
        reading = read_request([prompt], index)
        assert reading.kind == kind, prompt[:200]
        assert reading.match is not None
        for name, value in features.items():
            got = getattr(reading, name)
            assert (set(got) if name == "tags" else got) == value, (kind, name)


def test_shown_material_is_separated_from_instructions(all_problems, index):
    problem = _first(all_problems, "gsm8k")
    review = read_request(
        [prompts.review(problem.question, "Step by step: 3 + 4 = 7.\nSo 7.", "math")], index
    )
    assert review.solution == "Step by step: 3 + 4 = 7.\nSo 7."
    revise = read_request(
        [prompts.revise(problem.question, "It is 7.", "Count the eggs again.", "math")], index
    )
    assert revise.solution == "It is 7." and revise.feedback == "Count the eggs again."
    worded = read_request(
        [prompts.revise(problem.question, "Step by step: 7.", "Think it through again.", "math")],
        index,
    )
    assert not worded.step_by_step  # the words of what is shown are not the instruction's
    choose = read_request(
        [prompts.sc_ensemble(problem.question, ["It is 7.", "It is 8.\nSure.", "It is 7."])], index
    )
    assert choose.candidates == ("It is 7.", "It is 8.\nSure.", "It is 7.")
    pool = read_request(
        [
            prompts.custom(
                "Solve it.",
                problem.question + "\n\n" + prompts.pool_block(["Maybe 7.", "Maybe 8."]),
            )
        ],
        index,
    )
    assert pool.kind == "answer" and pool.shown == ("Maybe 7.", "Maybe 8.")
    hinted = read_request(
        [prompts.custom("Solve it.", problem.question + "\n\n" + prompts.note_block("It is 7."))],
        index,
    )
    assert hinted.kind == "answer" and hinted.shown == ("It is 7.",)


def test_code_shown_raw_is_not_cut_by_its_own_colons(all_problems, index):
    problem = next(
        p for p in all_problems if p.benchmark == "humaneval" and "Example" in p.question
    )
    code = problem.question + "    return None\n"
    reading = read_request([prompts.review(problem.question, code, "code")], index)
    assert reading.kind == "review"
    assert reading.solution is not None and reading.solution.strip() == code.strip()


def test_paraphrased_requests_are_understood(all_problems, index):
    problem = _first(all_problems, "gsm8k")
    q = problem.question
    paraphrases = {
        "review": f"Here is a problem:\n{q}\n\nAttempt:\nThe total is 12.\n\n"
        "Please verify whether this attempt is right or wrong, and explain.",
        "revise": f"{q}\n\nDraft answer:\nThe total is 12.\n\nComments:\nYou forgot the tax."
        "\n\nRewrite the draft to address the comments.",
        "choose": f"{q}\n\n(A) 12\n(B) 14\n(C) 12\n\nWhich option do most of them agree on? "
        "Reply with the letter.",
        "format": f"{q}\n\nWorked solution:\nWe add 5 and 7 to get 12.\n\n"
        "Extract just the final number from the worked solution.",
    }
    for kind, prompt in paraphrases.items():
        assert read_request([prompt], index).kind == kind, kind
    think = read_request([f"Let's think it through carefully.\n\n{q}"], index)
    assert think.step_by_step and not think.concise
    brief = read_request([f"{q}\n\nAnswer with only the final answer, nothing else."], index)
    assert brief.concise and brief.answer_only


def test_system_and_user_messages_are_read_together(all_problems, index):
    problem = _first(all_problems, "drop")
    reading = read_request(["You are a careful assistant. Be concise.", problem.question], index)
    assert reading.match is not None and reading.concise


def test_a_prompt_about_no_problem_is_still_read(index):
    reading = read_request(
        ["Write the Python function `fizzbuzz` that returns the FizzBuzz list up to n."], index
    )
    assert reading.match is None
    assert reading.kind == "code" and reading.entry_point == "fizzbuzz"


def test_prompts_shaped_like_aflows_own_are_understood(all_problems, index):
    """AFlow's operators inline the problem after a label and use markdown headings."""
    math = _first(all_problems, "gsm8k")
    qa = _first(all_problems, "hotpotqa")
    code = _first(all_problems, "humaneval")
    solutions = "".join(
        f"{letter}: \n{text}\n\n\n"
        for letter, text in zip("ABC", ("It is Paris.", "It is Lyon.", "It is Paris."), strict=True)
    )
    vote = read_request(
        [
            f"Given the question described as follows: {qa.question}\n"
            f"Several solutions have been generated. They are as follows:\n{solutions}"
            "Carefully evaluate these solutions and identify the answer that appears most "
            "frequently across them.\n\nFill in <thought> and <solution_letter>."
        ],
        index,
    )
    assert vote.kind == "choose" and vote.candidates == (
        "It is Paris.",
        "It is Lyon.",
        "It is Paris.",
    )
    assert not vote.judge
    answer = read_request(
        [
            "Think step by step and solve the problem. In the thought field explain your "
            "reasoning; in the answer field give the final answer concisely.\n"
            f"Your task: {math.question}"
        ],
        index,
    )
    assert answer.kind == "answer" and answer.match is not None
    assert answer.match.problem.problem_id == math.problem_id
    assert answer.step_by_step and answer.concise
    fix = read_request(
        [
            f"### problem\n{code.question}\n### Code Solution\n{code.question}    return 0\n"
            "### Execution Result\nfailed\n#### Failed Test Case\nassert candidate(1) == 2\n"
            "Please reflect on the failure, then give a better code solution."
        ],
        index,
    )
    assert fix.kind == "test_fix" and fix.errors is not None
    assert fix.solution is not None and fix.solution.rstrip().endswith("return 0")
