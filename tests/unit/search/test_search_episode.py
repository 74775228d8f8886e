"""The episode state machine: reset, step, rewards, dedupe, convergence, determinism."""

from __future__ import annotations

import dataclasses

import pytest

from aflowrl.config.environment import EvaluationSpec
from aflowrl.errors import InvalidInputError
from aflowrl.search import (
    AnchorMonteCarlo,
    EpisodeOverError,
    EpisodeState,
    EpisodeStateError,
    StaticValues,
    graph_at,
    project_action,
    reset,
    step,
)
from aflowrl.search.values import ValueQuery
from aflowrl.workflow import library

STEP_BY_STEP = (
    'set_prompt generate "Solve the following math problem step by step. Explain each step '
    'of your reasoning, then write the final answer in \\\\boxed{} at the end."'
)


def _choose(observation, text: str) -> str:
    """The choice-mode response naming the listed action ``text``."""
    return f"<action>{observation.admissible_actions.index(text) + 1}</action>"


async def test_reset_evaluates_the_seed_and_observes_it(make_context, executor):
    ctx = make_context(max_steps=3)
    start = await reset(ctx, seed=5, episode_id="e1")
    state = start.state
    seed = library.load("seed", "math")
    assert len(state.nodes) == 1 and state.parent == 0 and state.step == 0
    assert state.nodes[0].hash == seed.content_hash == start.observation.anchor
    assert start.seed_evaluation.executor_calls == 12 == len(executor.calls)
    assert state.nodes[0].score == pytest.approx(start.seed_evaluation.mean)
    assert 0 < state.nodes[0].score < 1 and state.nodes[0].wrong
    observation = start.observation
    assert observation.mode == "choice" and len(observation.admissible_actions) == 16
    for part in ("gsm8k (math tasks)", "generate = Custom", "## Operators", "got wrong"):
        assert part in observation.text
    assert "- add ScEnsemble after generate samples=5\n" in observation.text
    assert observation.in_tree == (None,) * 16  # the tree holds only the seed: nothing marked
    assert state.episode_id == "e1" and EpisodeState.from_json(state.to_json()) == state


async def test_a_valid_step_evaluates_the_child_and_rewards_the_change(make_context, executor):
    ctx = make_context(max_steps=3)
    start = await reset(ctx, seed=5)
    outcome = await step(ctx, start.state, _choose(start.observation, STEP_BY_STEP))
    info = outcome.info
    assert info.valid_action and not info.duplicate and info.child_index == 1
    assert info.executor_calls == 12 and info.cache_hits == 0
    state = outcome.state
    assert state.step == 1 and len(state.nodes) == 2 and state.nodes[1].parent == 0
    assert outcome.reward == pytest.approx(state.nodes[1].score - state.nodes[0].score)
    assert state.nodes[1].score > state.nodes[0].score  # step by step helps this executor
    assert info.best_score == state.nodes[1].score and not outcome.done
    assert outcome.observation.anchor == state.nodes[state.parent].hash
    assert "step by step" in str(graph_at(state, 1).prompts)


async def test_an_invalid_action_is_a_no_op_with_a_flag(make_context, executor):
    ctx = make_context(max_steps=3)
    start = await reset(ctx, seed=5)
    calls = len(executor.calls)
    outcome = await step(ctx, start.state, "I would add an ensemble")
    assert not outcome.info.valid_action and "no <action>" in outcome.info.invalid_reason
    assert outcome.reward == 0.0 and len(executor.calls) == calls
    assert outcome.state.step == 1 and outcome.state.nodes == start.state.nodes
    attempt = outcome.state.attempts[0]
    assert not attempt.valid and attempt.action == "I would add an ensemble"
    assert outcome.info.child_hash == start.state.nodes[0].hash
    # The rejection is part of the experience shown next time this workflow is modified.
    assert "[rejected]" in outcome.observation.text
    # A hostile response does not bloat the state.
    huge = await step(ctx, outcome.state, "<action>" + "x" * 50_000 + "</action>")
    assert len(huge.state.to_json()) < len(outcome.state.to_json()) + 1000


async def test_an_existing_workflow_is_reported_not_re_evaluated(make_context, executor):
    ctx = make_context(max_steps=4, selection="ucb", ucb_c=1.0)
    start = await reset(ctx, seed=1)
    first = await step(ctx, start.state, "<action>1</action>")  # + ScEnsemble, fan-out 5
    assert first.state.parent == first.info.child_index  # UCB: the unexplored child
    calls = len(executor.calls)
    removal = _choose(first.observation, "remove ensemble")
    back = await step(ctx, first.state, removal)  # back to the seed workflow
    assert back.info.duplicate and back.info.child_index == 0 and back.info.executor_calls == 0
    assert len(executor.calls) == calls and len(back.state.nodes) == 2
    # No improvement is paid for a workflow the tree holds: the step costs the penalty.
    assert back.reward == pytest.approx(-ctx.search.duplicate_penalty)
    assert back.state.attempts[-1].duplicate and back.state.attempts[-1].reward == back.reward
    assert back.info.best_gain == pytest.approx(first.info.best_gain)  # nothing new was added
    shown = await _observe_node(ctx, back.state, 1)
    assert "[duplicate of workflow #0, nothing gained]" in shown.text
    # The action that leads back to the seed is marked in the list of admissible actions.
    marked = shown.in_tree[shown.admissible_actions.index("remove ensemble")]
    assert marked == 0
    assert "- remove ensemble   [already in the tree as workflow #0" in shown.text


async def test_with_list_duplicates_off_every_listed_action_makes_a_new_workflow(
    make_context, executor
):
    ctx = make_context(max_steps=4, selection="ucb", ucb_c=1.0, list_duplicates=False)
    start = await reset(ctx, seed=1)
    first = await step(ctx, start.state, "<action>1</action>")  # + ScEnsemble, fan-out 5
    listed = first.observation.admissible_actions
    assert "remove ensemble" not in listed  # it leads back to the seed, which the tree holds
    assert first.observation.in_tree == (None,) * len(listed)
    assert "already in the tree" not in first.observation.text
    # The slots go to new workflows: a bounded list is as long as with duplicates shown.
    bounded = make_context(
        max_steps=4, selection="ucb", ucb_c=1.0, list_duplicates=False, max_admissible_actions=6
    )
    few = await step(bounded, (await reset(bounded, seed=1)).state, "<action>1</action>")
    assert len(few.observation.admissible_actions) == 6
    for k in range(1, 7):
        assert not (await step(bounded, few.state, f"<action>{k}</action>")).info.duplicate
    # A number refers to this list: every choice is a new child.
    for k in range(1, len(listed) + 1):
        outcome = await step(ctx, first.state, f"<action>{k}</action>")
        assert outcome.info.valid_action and not outcome.info.duplicate


async def _observe_node(ctx, state, index):
    from aflowrl.search import observe

    return observe(ctx, state.model_copy(update={"parent": index}))


async def test_delta_best_rewards_only_improvements_over_the_best(make_context):
    ctx = make_context(max_steps=3, reward="delta-best", selection="ucb", ucb_c=0.0)
    start = await reset(ctx, seed=5)
    outcome = await step(ctx, start.state, _choose(start.observation, STEP_BY_STEP))
    best_before = start.state.best_score
    assert outcome.reward == pytest.approx(outcome.state.nodes[1].score - best_before)


async def test_the_episode_ends_at_max_steps_and_refuses_more(make_context):
    ctx = make_context(max_steps=2)
    start = await reset(ctx, seed=2)
    one = await step(ctx, start.state, "<action>1</action>")
    two = await step(ctx, one.state, "<action>2</action>")
    assert not one.done and two.done and two.state.done_reason == "max_steps"
    assert two.info.done_reason == "max_steps"
    with pytest.raises(EpisodeOverError):
        await step(ctx, two.state, "<action>1</action>")


async def test_convergence_ends_the_episode_when_the_top_k_mean_stalls(make_context):
    ctx = make_context(max_steps=50, convergence_rounds=2, convergence_top_k=1)
    state = (await reset(ctx, seed=3)).state
    outcomes = []
    while not state.done:
        outcome = await step(ctx, state, "not an action")  # nothing changes: the best stalls
        outcomes.append(outcome)
        state = outcome.state
    assert len(outcomes) == 2 and state.done_reason == "converged"
    assert [o.state.stale for o in outcomes] == [1, 2]


async def test_episodes_are_reproducible_and_retries_give_the_same_result(make_context):
    async def play(seed: int) -> list[EpisodeState]:
        ctx = make_context(max_steps=5, evaluation=EvaluationSpec(max_problems=8))
        start = await reset(ctx, seed=seed)
        states = [start.state]
        observation = start.observation
        while not states[-1].done:
            k = 1 + states[-1].step % len(observation.admissible_actions)
            outcome = await step(ctx, states[-1], f"<action>{k}</action>")
            retry = await step(ctx, states[-1], f"<action>{k}</action>")
            assert retry.state == outcome.state and retry.reward == outcome.reward
            assert retry.observation == outcome.observation
            states.append(outcome.state)
            observation = outcome.observation
        return states

    first = await play(11)
    assert [s.to_json() for s in await play(11)] == [s.to_json() for s in first]
    # Any replica continues from the JSON form alone.
    revived = EpisodeState.from_json(first[2].to_bytes())
    assert revived == first[2]


async def test_fused_selection_needs_a_value_source(make_context):
    with pytest.raises(InvalidInputError, match="value source"):
        await reset(make_context(selection="fused"), seed=0)
    values = StaticValues({}, default=0.0)
    ctx = make_context(max_steps=3, selection="fused", fused_w=1.0, values=values)
    start = await reset(ctx, seed=0)
    one = await step(ctx, start.state, "<action>1</action>")
    # With w = 1 the value alone decides: favour the seed workflow.
    values.values[one.state.nodes[0].hash] = 5.0
    assert (await step(ctx, one.state, "<action>2</action>")).state.parent == 0
    values.values[one.state.nodes[1].hash] = 9.0
    assert (await step(ctx, one.state, "<action>2</action>")).state.parent == 1


async def test_anchor_monte_carlo_values_steer_fused_selection(make_context):
    table = AnchorMonteCarlo()
    ctx = make_context(max_steps=4, selection="fused", fused_w=0.9, values=table)
    start = await reset(ctx, seed=0)
    table.record(start.state.nodes[0].hash, -1.0)
    one = await step(ctx, start.state, "<action>1</action>")
    assert one.state.parent == 1  # the seed's observed returns are poor
    restored = AnchorMonteCarlo.from_dict(table.to_dict())
    assert restored.value(start.state.nodes[0].hash) == -1.0 and restored.value("other") == 0.0


async def test_a_state_from_another_environment_is_refused(make_context, executor):
    ctx = make_context(max_steps=3)
    start = await reset(ctx, seed=0)
    other = dataclasses.replace(executor, executor_id="another-model")
    from aflowrl.benchmarks import get_benchmark
    from aflowrl.search import SearchContext
    from aflowrl.workflow import Evaluator

    foreign = SearchContext(Evaluator(other, get_benchmark("gsm8k")), ctx.problems)
    with pytest.raises(EpisodeStateError, match="executor"):
        await step(foreign, start.state, "<action>1</action>")
    fewer = SearchContext(ctx.evaluator, ctx.problems[:-1])
    with pytest.raises(EpisodeStateError, match="problems"):
        await step(fewer, start.state, "<action>1</action>")
    math_ctx = SearchContext(Evaluator(executor, get_benchmark("math")), ctx.problems)
    with pytest.raises(EpisodeStateError, match="benchmark"):
        await step(math_ctx, start.state, "<action>1</action>")


async def test_project_action_predicts_the_child_without_evaluating(make_context, executor):
    ctx = make_context(max_steps=3)
    start = await reset(ctx, seed=0)
    calls = len(executor.calls)
    projection = project_action(ctx, start.state, "<action>3</action>")
    assert projection.valid and len(executor.calls) == calls
    outcome = await step(ctx, start.state, "<action>3</action>")
    assert outcome.info.child_hash == projection.child_hash
    assert not project_action(ctx, start.state, "<action>99</action>").valid


async def test_text_and_freeform_modes(make_context):
    text_ctx = make_context(max_steps=2, action_mode="text")
    start = await reset(text_ctx, seed=0)
    assert "## Action language" in start.observation.text
    assert "Admissible actions" not in start.observation.text
    outcome = await step(
        text_ctx, start.state, '<action>set_prompt generate "Think step by step."</action>'
    )
    assert outcome.info.valid_action and outcome.info.child_index == 1
    free_ctx = make_context(max_steps=2, action_mode="freeform")
    start = await reset(free_ctx, seed=0)
    assert '"nodes"' in start.observation.text
    graph = library.load("cot_sc", "math").to_json(indent=None)
    outcome = await step(free_ctx, start.state, f"<action>{graph}</action>")
    assert outcome.info.valid_action
    assert outcome.state.nodes[1].graph is not None and outcome.state.nodes[1].action is None
    assert graph_at(outcome.state, 1).content_hash == library.load("cot_sc", "math").content_hash


async def test_a_value_change_moves_fused_selection_exactly_at_the_formulas_margin(make_context):
    """F(i) = (1 - w) UCB(i) + w V(s_i): raising V(s_j) by more than (F_best - F_j) / w makes
    j the next parent, by less does not; a workflow without a value takes its parent's."""
    from aflowrl.search import selection

    w = 0.5
    values = StaticValues({}, default=0.0)
    ctx = make_context(max_steps=6, selection="fused", fused_w=w, ucb_c=0.3, values=values)
    state = (await reset(ctx, seed=0)).state
    for k in (0, 1):
        state = (await step(ctx, state, admissible_text(ctx, state, k))).state
    base = {n.hash: 0.01 * i for i, n in enumerate(state.nodes)}
    values.values = dict(base)
    action = admissible_text(ctx, state, 0)
    after = (await step(ctx, state, action)).state  # the tree the selection sees
    nodes = after.nodes
    assert all(n.hash in base for n in nodes)  # (the step made a duplicate: no new node)
    stats = [
        selection.NodeStats(n.score, after.visits(i), is_root=i == 0) for i, n in enumerate(nodes)
    ]
    ucb = selection.ucb_scores(stats, 0.3)
    fused = selection.fused_scores(ucb, [base[n.hash] for n in nodes], w)
    best = selection.argmax(fused)
    assert after.parent == best
    target = next(i for i in range(len(nodes)) if i != best)
    margin = (fused[best] - fused[target]) / w
    for bump, expected in ((margin - 1e-6, best), (margin + 1e-6, target)):
        values.values = {**base, nodes[target].hash: base[nodes[target].hash] + bump}
        assert (await step(ctx, state, action)).state.parent == expected
    # A workflow absent from the table is valued as its nearest valued ancestor.
    child = len(nodes) - 1
    parent = nodes[child].parent
    assert parent is not None
    values.values = {nodes[parent].hash: 7.0}
    values.default = -7.0
    queries = [
        ValueQuery(
            n.hash,
            graph_at(state, i),
            n.score,
            1,
            tuple(nodes[a].hash for a in state.ancestors(i)),
        )
        for i, n in enumerate(nodes)
    ]
    got = await values(queries)
    assert got[child] == 7.0 and got[parent] == 7.0
    unrelated = [i for i in range(len(nodes)) if i != parent and parent not in state.ancestors(i)]
    assert all(got[i] == -7.0 for i in unrelated)


def admissible_text(ctx, state, k: int) -> str:
    """The reply choosing the k-th listed action of ``state``'s next parent."""
    from aflowrl.search import observe

    return f"<action>{observe(ctx, state).admissible_actions[k]}</action>"


async def test_improvement_rewards_add_up_to_the_episodes_best_gain(make_context, executor):
    ctx = make_context(max_steps=4, selection="ucb", ucb_c=1.0, reward="improvement")
    start = await reset(ctx, seed=1)
    state, total, worse = start.state, 0.0, 0
    for choice in (1, 2, 3, 4):
        outcome = await step(ctx, state, f"<action>{choice}</action>")
        best_before = max(n.score for n in state.nodes)
        child = outcome.state.nodes[outcome.info.child_index]
        if not outcome.info.duplicate:
            assert outcome.reward == pytest.approx(max(0.0, child.score - best_before))
            worse += child.score < state.nodes[state.parent].score  # delta-parent: negative
        total += outcome.reward
        state = outcome.state
    assert worse and total == pytest.approx(max(0.0, state.best_gain))


async def test_test_pool_episodes_score_on_chunks_of_the_test_split(make_context):
    from aflowrl.benchmarks import Problem

    test_split = [Problem("gsm8k", f"t{i}", f"What is {i} + 2?", str(i + 2)) for i in range(12)]
    ctx = dataclasses.replace(
        make_context(max_steps=2),
        evaluation=EvaluationSpec(max_problems=4),
        test_problems=test_split,
    )
    seen = []
    for seed in (30, 31, 32):
        start = await reset(ctx, seed=seed, pool="test")
        assert start.state.pool == "test" and start.state.split == "test"
        problems = ctx.episode_problems(seed, 4, "test")
        assert {p.problem_id for p in problems} <= {p.problem_id for p in test_split}
        seen.append({p.problem_id for p in problems})
        outcome = await step(ctx, start.state, "<action>1</action>")  # the state checks out
        assert outcome.info.valid_action
    assert len(seen[0] | seen[1] | seen[2]) == 12
    with pytest.raises(InvalidInputError, match="no gsm8k test split is loaded"):
        await reset(make_context(max_steps=2), seed=30, pool="test")
