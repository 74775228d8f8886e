"""The observation text: its sections, its bound, and what it says when it cuts."""

from __future__ import annotations

import pytest

from aflowrl.benchmarks import Problem
from aflowrl.search import observe, reset, step
from aflowrl.search.observation import clip
from aflowrl.workflow import library


def test_clip_states_the_cut():
    assert clip("a  b\n c", 10) == "a b c"
    clipped = clip("x" * 500, 100)
    assert len(clipped) <= 100 and clipped.endswith("[+424 chars]")


async def test_sections_in_order(make_context):
    ctx = make_context(max_steps=4)
    start = await reset(ctx, seed=0)
    first = start.observation.admissible_actions[0]
    state = (await step(ctx, start.state, f"<action>{first}</action>")).state
    text = observe(ctx, state.model_copy(update={"parent": 0})).text
    order = [
        "# Optimising an agentic workflow for gsm8k",
        "## Workflow to modify: #0",
        "## Tried on this workflow (1 steps, newest first)",
        "## Problems it got wrong",
        "## Operators",
        "## Admissible actions",
        "## Reply",
    ]
    positions = [text.index(part) for part in order]
    assert positions == sorted(positions)
    assert "add ScEnsemble after generate samples=5 ->" in text
    assert "question: What is" in text and "expected:" in text and "produced:" in text
    assert "the tree holds 2 workflows" in text


async def test_every_prompt_and_candidate_is_shown_in_full(make_context):
    long_prompt = "Solve the problem with great care, checking each step. " * 40  # 2,240 chars
    ctx = make_context(max_steps=3, max_observation_chars=20_000)
    seed = library.load("seed", "math").with_instruction("generate", long_prompt)
    start = await reset(ctx, seed=0, seed_workflow=seed)
    observation = start.observation
    assert long_prompt.strip() in observation.text
    for action in observation.admissible_actions:
        assert f"- {' '.join(action.split())}" in observation.text
    assert "... [+" not in observation.text.split("## Problems it got wrong")[0]
    assert "left out" not in observation.text


@pytest.mark.parametrize("limit", [500, 1500, 3000, 6000])
async def test_the_bound_holds_with_huge_prompts_and_problems(make_context, limit):
    huge = "What is 3 + 4? " + "Consider this very long story. " * 2000
    ctx = make_context(max_steps=3, max_observation_chars=limit, failed_examples=5)
    ctx = type(ctx)(
        ctx.evaluator,
        [
            Problem("gsm8k", f"h{i}", huge.replace("3 + 4", f"{i} + 4"), str(i + 4))
            for i in range(6)
        ],
        ctx.search,
        ctx.evaluation,
    )
    seed = library.load("seed", "math").with_instruction("generate", "Solve it. " * 700)
    start = await reset(ctx, seed=0, seed_workflow=seed)
    text = start.observation.text
    assert len(text) <= limit
    assert "## Reply" in text or "observation cut" in text
    if limit >= 3000:
        assert "## Admissible actions" in text and "## Reply" in text
        assert "chars)" in text  # the 7,000-character prompt had to be shortened, saying so
    if limit == 500:
        assert "observation cut to 500 characters" in text


async def test_dropped_items_are_counted(make_context):
    ctx = make_context(max_steps=20, max_observation_chars=4200, selection="ucb", ucb_c=0.0)
    state = (await reset(ctx, seed=0)).state
    for k in range(8):
        wordy = f"<action>not an action {k} " + "and more words " * 12 + "</action>"
        state = (await step(ctx, state, wordy)).state
    text = observe(ctx, state.model_copy(update={"parent": 0})).text
    assert len(text) <= 4200
    # The newest steps are kept first; the rest are counted.
    assert "## Tried on this workflow (8 steps, newest first)" in text
    assert "not an action 7 " in text and "not an action 0 " not in text
    assert "of 8 steps left out to fit the observation]" in text
    # A section with no room at all still says it was left out.
    tight = make_context(max_steps=20, max_observation_chars=2600, selection="ucb", ucb_c=0.0)
    text = observe(tight, state.model_copy(update={"parent": 0})).text
    assert "## Operators" not in text and "[Operators:" in text and "left out" in text
