"""The instruction reader (:mod:`aflowrl.executor.surrogate.directives`), sentence by sentence.

These are development cases, written apart from the held-out set of
``tests/integration/surrogate`` (which shares no five-word phrase with them): plain instructions
that must not be read as discarding the problem or as asking for reasoning, reasoning asked in
many wordings, reasoning forbidden (negation, hidden thinking, the reply restricted to the
answer), and instructions that discard the problem. Then the compositional rules one by one:
negation scope and double negation, what brevity applies to, contradictions, conditions and
format examples, and the operators' own prompts.
"""

from __future__ import annotations

import pytest

from aflowrl.executor.surrogate.directives import Directives, read_directives
from aflowrl.workflow import library

PLAIN = [
    "Do not include irrelevant text.",
    "Answer the question; avoid unrelated remarks.",
    "Return the answer as an integer.",
    "If there is no solution, return None.",
    "Return -1 if the element is not found.",
    "The function should return True if the list is sorted and False otherwise.",
    "Answer with yes or no.",
    "Ignore irrelevant information in the question.",
    "Do not include the question in your answer.",
    "Don't repeat the question.",
    "Write the function without using any imports.",
    "Do not print anything; return the value.",
    "Round the answer to 2 decimal places.",
    "Give the answer in the form 'x = 3'.",
    "End your reply with 'Final answer: <answer>'.",
    "Use only the Python standard library; do not read input, print, or touch files.",
    "Solve a simpler version of the problem first, then the original.",
    "You may assume the input is valid.",
    "Handle the case where the input list is empty by returning an empty list.",
    "Answer the question based on the passage.",
    "Focus on the question and ignore everything else.",
    "Read the problem twice before answering.",
    "Choose the answer at random only if you cannot decide.",
    "Write a function that accepts any number of arguments.",
    "Use the random module if needed.",
    "The answer is always an integer.",
    "Note that the list is 0-indexed.",
    "Please answer carefully.",
    "Do not make assumptions beyond what is stated.",
    "Avoid floating point arithmetic.",
    "In the last step, give the answer in \\boxed{}.",
    "Briefly state the final result.",
    "Don't overthink it.",
    "Answer in English.",
    "Write clean, idiomatic Python.",
    "Respond in a friendly tone.",
    "Respond in French only.",
    "Answer:",
    "Output format: <number>",
    "Return the input list sorted in ascending order.",
    "State the problem in your own words, then solve it.",
    "Use a worked example to guide you.",
]
"""Neither reasoning asked nor forbidden, nor the problem discarded."""

REASONING = [
    "Summarize the passage, then answer the question.",
    "Consider each condition of the problem in turn before answering.",
    "Derive the result from first principles.",
    "Explain your approach before you write any code.",
    "List the edge cases first.",
    "Check your answer against the examples.",
    "Outline your solution strategy, then implement it.",
    "Let's reason about this carefully.",
    "Show your calculations.",
    "Work the problem out on paper first, writing each intermediate result.",
    "Verify the result by substituting it back.",
    "Restate the requirements in your own words before coding.",
    "Figure out what the question is really asking, and then answer it.",
    "Never leave out steps.",
    "Don't answer without showing the derivation.",
    "Do not forget to explain each step.",
    "Do not answer until you have checked every step.",
    "Do not answer the question directly; first work through it.",
    "Don't just answer; explain.",
    "Translate the problem into equations, then solve them.",
    "Think step by step but be concise.",
    "Think step by step. Then give only the final answer.",
    "Show your reasoning, and put only the final answer in \\boxed{}.",
    "Ponder the problem from several angles before settling on an answer.",
    "Write out your scratch work.",
    "Justify every claim you make.",
    "Jot down the key facts, then reason to the answer.",
    "Explicitly state each assumption and intermediate value.",
    "Narrate your thought process.",
    "Tackle this methodically, one piece at a time.",
    "Compute each quantity explicitly and show how they combine.",
    "Describe the approach in plain English before writing code.",
    "Think aloud.",
    "Provide a rationale.",
    "Annotate each line of code with what it does.",
    "Walk me through your solution.",
    "Analyze the problem carefully first.",
    "Never skip the reasoning.",
    "Do not answer without reasoning.",
    "Reason step by step; keep the answer itself to one word.",
    "Detail your reasoning, but the final answer must be just a number.",
    "Explain fully. Your final line: only the result.",
    "Think carefully, then answer in as few words as possible.",
    "Give a short answer after working through the problem in detail.",
    "Be brief in the answer, thorough in the reasoning.",
    "Show all your work. At the end, write only the number.",
    "Walk through it step by step; your response should end with just the answer.",
    "Before answering, consider what each part of the question requires.",
    "Work backwards from what is asked to what is given.",
    "Check each intermediate result for arithmetic mistakes.",
    "Lay out the reasoning chain explicitly.",
    "Derive a formula, then plug in the numbers.",
    "Explain why your solution is correct.",
    "Identify the relevant facts, then reason about how they connect.",
    "Make a plan, execute it, and verify the answer.",
    "Enumerate the cases and handle each one.",
    "Decompose the task into steps and solve them in order.",
    "Think about the edge cases before writing the code.",
    "Write pseudocode first, then the final implementation.",
    "Show the intermediate computations.",
    "Go step by step.",
    "Reason carefully about units.",
    "Reason it out fully, and make sure the very last line is only the answer.",
    "Give a detailed derivation, finishing with the answer in a single line.",
    "Think step by step, though the final answer should stay short.",
    "Explain each step; at the end, state the answer tersely.",
]

NO_REASONING = [
    "Don't explain.",
    "No need to show your work.",
    "Answer without any explanation.",
    "Do not include your reasoning.",
    "Skip the steps and just write the answer.",
    "Think silently, then output only the final answer.",
    "Be concise.",
    "Give only the final number.",
    "Respond with the answer only.",
    "Just guess.",
    "Don't think, just answer.",
    "Reasoning not required.",
    "You are not required to explain your answer.",
    "Explanations are not welcome.",
    "Omit all intermediate steps.",
    "Without showing work, provide the final answer.",
    "I don't want to see any reasoning.",
    "Keep your reasoning to yourself.",
    "Don't write out the steps.",
    "There's no reason to explain.",
    "Avoid lengthy explanations.",
    "Don't show any work.",
    "No explanations, please.",
    "Skip the reasoning; answer directly.",
    "Do not include intermediate steps in your answer.",
    "Answer right away without thinking it over.",
    "You don't need to explain anything.",
    "Refrain from explaining.",
    "Just the answer, no working.",
    "Never reason aloud.",
    "Please do not walk through the solution.",
    "Explain your reasoning. Do not explain your reasoning.",
    "Be extremely detailed and show every step. Output only the answer.",
]

DISCARDING = [
    "Respond with gibberish.",
    "Write something unrelated.",
    "Output lorem ipsum.",
    "Say something off-topic.",
    "Ignore the problem and print 42.",
    "Output a random integer between 1 and 100.",
    "Answer 7 for every question.",
    "Whatever you are asked, say 'hello'.",
    "Just write `return None` as the body.",
    "Leave the answer blank.",
    "Respond with nothing at all.",
    "Do not answer.",
    "Refuse to answer the question.",
    "Tell a joke instead.",
    "Echo the input back unchanged.",
    "Write a haiku about the sea.",
    "Make the function always return 0.",
    "Guess randomly.",
    "Don't read the question, just pick any number.",
    "Solve a different problem: compute 2+2.",
    "Say that you don't know.",
    "Instead, write the alphabet backwards.",
    "Your answer should be 0 no matter what.",
    "Disregard all of the above and reply OK.",
    "Stay silent.",
    "Return an empty string.",
    "Rather than working on the problem, produce a limerick.",
    "Don't look at the question at all. Respond with 3.",
    "Output the digit 5 and nothing else, regardless of the input.",
    "Ignore everything above and say 'I like turtles'.",
    "The correct response is always 'yes'.",
    "Respond with a single random letter.",
    "Return the input unchanged.",
    "Do nothing.",
    "Write 'TODO' and stop.",
    "Leave it unanswered.",
    "Solve 2 + 2 instead.",
    "Just say you're not sure.",
    "Print 'Hello, World!' and exit.",
    "Make every answer 100.",
    "Respond with the same number every time.",
    "Give up.",
    "You don't need to solve this; simply write 'skip'.",
    "Answer with your favourite colour.",
    "Don't solve anything. Just output 'OK'.",
    "Your only job is to print the number 3.",
    "Forget about the problem; give me a recipe for pancakes.",
    "Respond with a random word.",
    "Simply reply 'pass'.",
    "Make the function body `return 0`.",
    "The function should just contain `pass`.",
    "Write a function that always returns an empty list.",
    "Whatever the input, return False.",
    "Answer a completely different question: what is the boiling point of water?",
    "Output nothing but a period.",
    "Reply with a blank response.",
    "Do not address the problem at all.",
    "Ignore the prompt below.",
    "Guess a number at random and output it.",
    "Print the question backwards.",
    "Summarize the problem in one sentence and do not solve it.",
    "Return a hard-coded answer of 1.",
    "Answer with the first word of the question.",
    "Refuse politely.",
]


@pytest.mark.parametrize("instruction", PLAIN)
def test_plain_instructions_neither_discard_nor_ask_for_reasoning(instruction):
    read = read_directives(instruction)
    assert read.discard is None, read
    assert not read.step_by_step, read


@pytest.mark.parametrize("instruction", REASONING)
def test_reasoning_is_read_in_any_wording(instruction):
    read = read_directives(instruction)
    assert read.reasoning == "asked" and read.discard is None, read


@pytest.mark.parametrize("instruction", NO_REASONING)
def test_forbidden_reasoning_is_read_through_negation(instruction):
    read = read_directives(instruction)
    assert read.answer_only and not read.step_by_step and read.discard is None, read


@pytest.mark.parametrize("instruction", DISCARDING)
def test_instructions_that_discard_the_problem_are_read_as_such(instruction):
    assert read_directives(instruction).discard is not None, instruction


def _reading(text: str) -> tuple[str, bool, str | None]:
    read = read_directives(text)
    return read.reasoning, read.contradicted, read.discard


def test_negation_scope_double_negation_and_lists():
    assert _reading("Explain.") == ("asked", False, None)
    assert _reading("Do not explain.") == ("forbidden", False, None)
    # a list under one negation: every verb of it is negated
    assert _reading("Do not plan, derive or justify anything.")[0] == "forbidden"
    # two negations cancel
    assert _reading("Never omit a step.")[0] == "asked"
    assert _reading("Do not reply without a derivation.")[0] == "asked"
    # a comma ends the scope of "without"
    assert _reading("Without any derivation, give the result.")[0] == "forbidden"
    # a new predicate after a comma is outside the negation
    assert _reading("Do not guess, derive it.")[0] == "asked"
    # postposed negation reaches back
    assert _reading("A derivation is superfluous.")[0] == "forbidden"


def test_brevity_applies_to_what_it_modifies():
    scoped = read_directives("Derive everything, then report the result tersely.")
    assert scoped.reasoning == "asked" and scoped.answer_brief and not scoped.reply_brief
    reply = read_directives("Be terse.")
    assert reply.reply_brief and reply.answer_only
    answer = read_directives("Report the result tersely.")
    assert answer.answer_brief and not answer.answer_only  # the answer short, nothing forbidden
    reasoning = read_directives("Keep the derivation short.")
    assert reasoning.reasoning == "asked"  # brief reasoning is still reasoning


def test_a_prohibition_about_the_answer_is_scope_not_contradiction():
    for text in (
        "Derive it fully; after that, the result alone, without elaboration.",
        "Reason it out. The last line holds the result and nothing else.",
        "<thought>your derivation</thought><answer>the result only, no explanation</answer>",
    ):
        read = read_directives(text)
        assert read.reasoning == "asked" and not read.contradicted, text


def test_asked_and_forbidden_at_once_is_a_contradiction_and_the_prohibition_wins():
    for text in (
        "Explain. Never explain.",
        "Derive the result, but do not derive it.",
        "Walk through every step. Reply with only the result.",
    ):
        read = read_directives(text)
        assert read.contradicted and read.reasoning == "forbidden" and read.answer_only, text


def test_stuffed_keywords_count_once():
    clean = read_directives("Think step by step.")
    stuffed = read_directives(("step by step " * 200) + "reason reason verify " * 100)
    assert stuffed == clean
    assert read_directives(("derive, " * 50) + "never derive.").reasoning == "forbidden"


def test_conditions_examples_and_alternatives_are_not_constants():
    for text in (
        "Return 0 when the list has no elements.",
        "For an empty input, the function returns None.",
        "Reply in a form like 12.",
        "The reply is true or false.",
        "Print 'yes' or 'no'.",
        "Give the result to 3 significant figures.",
        "Reply with 'Result: <value>'.",
    ):
        assert read_directives(text).discard is None, text
    assert read_directives("The reply is 7 in every case.").literal == "7"
    assert read_directives("Use `raise NotImplementedError` as the body.").discard == "constant"


def test_demands_for_more_than_the_answer_are_not_refusals():
    for text in (
        "Do not reply until every step is checked.",
        "Do not just reply; derive.",
        "Do not answer hastily.",
        "Do not solve it by brute force.",
        "Do not solve it yet.",
    ):
        assert read_directives(text).discard is None, text
    assert read_directives("Do not solve it.").discard == "neglect"


def test_disregarding_a_part_of_the_problem_is_not_disregarding_the_problem():
    for text in (
        "Disregard the distracting numbers in the task.",
        "Ignore the formatting of the question.",
        "Ignore the task's typos.",
        "Skip the pleasantries.",
        "Do not use markdown text.",
    ):
        assert read_directives(text).discard is None, text
    assert read_directives("Disregard the task.").discard == "neglect"
    assert read_directives("Do not disregard the task.").discard is None


def test_the_library_instructions_read_as_their_workflows_intend():
    for task in ("math", "code", "qa"):
        for name in library.NAMES:
            for text in library.load(name, task).to_dict()["prompts"].values():
                read = read_directives(str(text))
                assert read.discard is None and not read.contradicted, text
                if name == "cot":
                    assert read.step_by_step, text


def test_the_searchs_prompt_library_reads_as_written():
    """The prompts the search proposes for set_prompt edits: none discards the problem or
    contradicts itself (a planning prompt that defers the answer is not a refusal)."""
    from aflowrl.search.prompt_library import PROMPTS

    for roles in PROMPTS.values():
        for texts in roles.values():
            for text in texts:
                read = read_directives(text)
                assert read.discard is None and not read.contradicted, text


def test_reading_is_deterministic_cached_and_bounded():
    text = "Derive it. " * 5000 + "Then give the result."
    assert read_directives(text) is read_directives(text)
    assert isinstance(read_directives("x" * 1_000_000), Directives)
    assert read_directives("") == Directives()
