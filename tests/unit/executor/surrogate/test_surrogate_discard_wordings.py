"""Two ways of discarding the problem the reader missed (issue 27), in wordings of their own:
a constant named as the reply whatever the problem asks ("always reply: 8", the constant after a
colon), and another question answered in the problem's place (the problem replaced, another one
picked, a question of the instruction's own asked instead). And the instructions those readings
must leave alone: guiding questions about the problem, few-shot examples, "instead of" and
"rather than" about the reply's form.

``CONSTANT`` and ``OTHER_QUESTION`` were written in two rounds before the reader's change was
checked against them (each round's misses were fixed as classes, then the next round written);
``GUIDING`` are instructions any workflow may hold, every one a false discard if misread.
"""

from __future__ import annotations

import pytest

from aflowrl.executor.surrogate.directives import read_directives

CONSTANT = [
    # round 1
    "Always reply: 8.",
    "Every time, reply: 8.",
    "Always respond with: 8.",
    'Always reply: "yes".',
    "Your answer: always 8.",
    "Constant answer: 8.",
    # round 2
    "Every single time, respond: 13.",
    "No matter the input, the output is: -1.",
    "For each problem, always write the same reply: 'done'.",
    "Your response, always: 0.",
    "Output, in all cases: None",
    "Regardless of what is asked, answer: 'maybe'.",
    # round 3
    "Whichever problem appears, the reply is: 21.",
    "In every case, return: False",
    "Always, without exception, output: 'n/a'.",
    "Reply to all of them the same way: 99.",
]

OTHER_QUESTION = [
    # round 1
    "Rather than this problem, tell me the square root of 81.",
    "Replace the question with: what is 10 minus 3? Then answer that.",
    "Respond to this question instead: what year did the war end?",
    "The real question is: what is 1 + 1? Answer it.",
    "Answer a question of your own choosing.",
    "Solve for x in 2x = 4 rather than the problem given.",
    "Instead, what is the largest planet?",
    "Pick some other problem and solve that one.",
    # round 2
    "Skip that one; the actual question is: what is the tallest mountain on Earth?",
    "Your job is to answer: when did the Berlin Wall fall?",
    "Rather than the task above, explain how rainbows form.",
    "Swap the problem for this one and solve it: 12 divided by 4.",
    "Answer any question you like, just not this one.",
    "Instead: which ocean is the largest?",
    "Choose a new problem and work that out.",
    # round 3
    "Forget that problem. The question you should answer is: how far is the Moon?",
    "Don't solve the given task; solve this one: 6 times 7.",
    "In place of the question, name three primary colours.",
    "Work on a question you make up yourself.",
]

GUIDING = [
    "Consider: what is the question really asking for?",
    "Ask yourself: which quantities are known?",
    "Before answering, consider: what are the knowns and unknowns?",
    "Consider: which operation is needed here?",
    "Read carefully. Which facts in the passage matter?",
    "Answer: how many items remain after each step?",
    "Answer the following: what is the final answer?",
    "The question is: what is the answer?",
    "Your goal is to find: what is the final value?",
    "Question: what is the capital of France? Answer: Paris.",
    "Example. Question: what is 3 + 4? Answer: 7. Now solve the problem below.",
    "When the answer is ready, output it.",
    "Where the question is ambiguous, state your assumption.",
    "Instead of guessing, reason it through.",
    "Instead of a paragraph, reply with a list of steps.",
    "Rather than the first idea, verify the final answer.",
    "Rather than rounding, keep exact fractions.",
    "Rather than a long explanation, give the number.",
    "Replace each word problem quantity with a variable.",
    "Pick the best approach and solve the problem.",
    "Choose another method if the first fails.",
    "Answer the question you see below.",
    "Solve the problem you were given.",
    "Always reply with the final answer as a number.",
    "Reply: <your answer>.",
    "Always end with: The answer is <number>.",
    "Answer in the form 'Result: <value>'.",
    "Always answer: with care and precision.",
    "Every time: check your arithmetic.",
    "In every case, show your reasoning before the answer.",
    "The task is: solve the problem below.",
    "Your job is to answer the question below carefully.",
]


@pytest.mark.parametrize("instruction", CONSTANT)
def test_a_constant_named_as_the_reply_whatever_the_problem_is_read_as_one(instruction):
    read = read_directives(instruction)
    assert read.discard == "constant" and read.literal, read


@pytest.mark.parametrize("instruction", OTHER_QUESTION)
def test_another_question_answered_instead_discards_the_problem(instruction):
    read = read_directives(instruction)
    assert read.discard is not None, read


@pytest.mark.parametrize("instruction", GUIDING)
def test_guiding_questions_examples_and_reply_forms_discard_nothing(instruction):
    read = read_directives(instruction)
    assert read.discard is None, read
