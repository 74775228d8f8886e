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
    state = (await step(ctx, start.state, "<action>1</action>")).state
    text = observe(ctx, state.model_copy(update={"parent": 0})).text
    order = [
        "# Optimising an agentic workflow for gsm8k",
        "## Workflow to modify: #0",
        "## Operators",
        "## Tried on this workflow (1 steps)",
        "## Problems it got wrong",
        "## Admissible actions",
        "## Reply",
    ]
    positions = [text.index(part) for part in order]
    assert positions == sorted(positions)
    assert "add ScEnsemble after generate samples=5 ->" in text
    assert "question: What is" in text and "expected:" in text and "produced:" in text


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
        assert "... [+" in text  # the long prompt and questions are clipped, saying by how much
    if limit == 500:
        assert "observation cut to 500 characters" in text


async def test_dropped_items_are_counted(make_context):
    ctx = make_context(max_steps=20, max_observation_chars=2500, selection="ucb", ucb_c=0.0)
    state = (await reset(ctx, seed=0)).state
    for _ in range(8):
        state = (await step(ctx, state, "<action>not a number</action>")).state
    text = observe(ctx, state.model_copy(update={"parent": 0})).text
    assert len(text) <= 2500
    assert "more cut to fit the observation" in text
