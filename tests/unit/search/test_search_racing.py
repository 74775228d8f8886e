"""Racing in the episode: a hopeless child is stopped, marked, rewarded honestly, and scored in
full before anything is measured against it; racing is refused where AFlow is reproduced."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from aflowrl.config import EnvironmentSpec, SearchSpec
from aflowrl.config.environment import EvaluationSpec, RacingSpec
from aflowrl.errors import InvalidInputError
from aflowrl.search import EpisodeState, SearchContext, StepOutcome, observe, reset, step

ADD_FORMAT = "add Format after generate"
RACING = EvaluationSpec(racing=RacingSpec(enabled=True, batch=2, delta=0.1))


@pytest.fixture
def executor(executor):
    """The arithmetic executor, except that a Format step always answers 0 (always wrong)."""
    plain = executor.answer

    def answer(prompt: str, seed: int) -> str:
        if "<answer>the final answer</answer>" in prompt:
            return "<answer>0</answer>"
        return plain(prompt, seed)

    executor.answer = answer
    return executor


@pytest.fixture
def racing_context(make_context):
    def make(evaluation: EvaluationSpec = RACING, **search) -> SearchContext:
        return make_context(
            evaluation=evaluation, selection="ucb", action_mode="text", max_steps=6, **search
        )

    return make


async def _raced_child(ctx: SearchContext) -> tuple[SearchContext, EpisodeState, StepOutcome]:
    start = await reset(ctx, seed=2)
    outcome = await step(ctx, start.state, f"<action>{ADD_FORMAT}</action>")
    return ctx, start.state, outcome


async def test_a_hopeless_child_is_raced_out_with_a_negative_reward(racing_context):
    ctx, start, outcome = await _raced_child(racing_context())
    total = len(ctx.problems)
    info = outcome.info
    child = outcome.state.nodes[info.child_index]
    parent = start.nodes[0]
    assert info.raced and child.raced and child.raced_after < total
    assert child.score == 0.0 and child.bound is not None and child.bound < parent.score
    assert outcome.reward == child.score - parent.score < 0
    # The step paid one Format call per problem raced (the generator's answers are the
    # parent's), not for every problem.
    assert info.executor_calls == child.raced_after < total
    assert EpisodeState.from_json(outcome.state.to_json()) == outcome.state
    # The policy is told the score is partial.
    shown = observe(ctx, outcome.state.model_copy(update={"parent": 0})).text
    assert "raced out" in shown and f"first {child.raced_after} problems" in shown


async def test_a_raced_node_is_scored_in_full_before_it_is_modified(racing_context, executor):
    ctx, _, outcome = await _raced_child(racing_context())
    total = len(ctx.problems)
    index = outcome.info.child_index
    raced = outcome.state.nodes[index]
    state = outcome.state.model_copy(update={"parent": index})
    assert "raced out; it is scored in full" in observe(ctx, state).text
    before = len(executor.requests)
    nxt = await step(ctx, state, "<action>remove generate</action>")
    completed = nxt.state.nodes[index]
    assert not completed.raced and completed.score == 0.0
    assert nxt.info.parent_score == completed.score
    remaining = total - raced.raced_after
    assert len(executor.requests) - before >= remaining
    assert nxt.info.executor_calls == len(executor.requests) - before


async def test_a_duplicate_of_a_raced_node_completes_it_before_the_reward(racing_context):
    ctx, _, outcome = await _raced_child(racing_context())
    index = outcome.info.child_index
    again = await step(
        ctx, outcome.state.model_copy(update={"parent": 0}), f"<action>{ADD_FORMAT}</action>"
    )
    assert again.info.duplicate and again.info.child_index == index
    assert not again.state.nodes[index].raced
    assert again.reward == pytest.approx(-ctx.search.duplicate_penalty)  # no improvement paid


async def test_a_good_child_is_scored_in_full_under_racing(racing_context):
    ctx = racing_context()
    start = await reset(ctx, seed=2)
    outcome = await step(
        ctx, start.state, "<action>add ScEnsemble after generate samples=5</action>"
    )
    child = outcome.state.nodes[outcome.info.child_index]
    assert not outcome.info.raced and not child.raced
    unraced = racing_context(EvaluationSpec())
    plain = await step(
        unraced,
        (await reset(unraced, seed=2)).state,
        "<action>add ScEnsemble after generate samples=5</action>",
    )
    assert child.score == plain.state.nodes[plain.info.child_index].score


async def test_racing_is_refused_with_aflow_selection(make_context):
    ctx = make_context(evaluation=RACING, selection="aflow")
    with pytest.raises(InvalidInputError, match="selection"):
        await reset(ctx, seed=0)
    with pytest.raises(ValidationError, match="racing"):
        EnvironmentSpec(evaluation=RACING, search=SearchSpec(selection="aflow"))
    assert EnvironmentSpec(evaluation=RACING, search=SearchSpec(selection="ucb"))
