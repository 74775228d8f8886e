"""Proposers: the random baseline, the LLM proposer's bounded retries, the resumable loop."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from aflowrl.search import Observation, project_action, reset
from aflowrl.search.optimize import run_search
from aflowrl.search.proposers import LLMProposer, RandomProposer
from aflowrl.search.rundir import RunDirectory


def _observation(mode="choice", actions=("a", "b", "c", "d")) -> Observation:
    return Observation("text", tuple(actions), "0" * 64, mode)


async def test_random_proposer_is_uniform_and_seeded():
    proposer = RandomProposer(seed=3)
    picks = [
        (await proposer.propose(_observation(), round=r, check=lambda _: None)).response
        for r in range(4000)
    ]
    counts = Counter(picks)
    assert set(counts) == {f"<action>{a}</action>" for a in "abcd"}
    assert all(abs(c / 4000 - 0.25) < 0.03 for c in counts.values())
    again = RandomProposer(seed=3)
    assert (await again.propose(_observation(), round=17, check=lambda _: None)).response == picks[
        17
    ]
    text = await proposer.propose(_observation("text"), round=0, check=lambda _: None)
    assert text.response in {f"<action>{a}</action>" for a in "abcd"}


async def test_llm_proposer_retries_unusable_replies_with_the_reason(make_context, scripted_chat):
    ctx = make_context(max_steps=2, action_mode="text")
    state = (await reset(ctx, seed=0)).state
    chat = scripted_chat(
        replies=[
            "I think an ensemble.",
            "<action>remove generate</action>",
            "<action>add ScEnsemble after generate</action>",
        ]
    )
    proposer = LLMProposer(chat, seed=1, max_retries=2)
    observation = (await reset(ctx, seed=0)).observation
    proposal = await proposer.propose(
        observation, round=0, check=lambda r: project_action(ctx, state, r)
    )
    assert proposal.response.endswith("</action>") and proposal.attempts == 3
    assert proposal.cost_usd == pytest.approx(0.003)
    assert proposal.prompt_tokens == sum(len(m[-1].content.split()) for m, _ in chat.requests)
    last = chat.requests[-1][0]
    assert last[0].role == "system" and last[1].content == observation.text
    assert "no <action>" in last[3].content and "reads only the problem" in last[5].content
    assert len({seed for _, seed in chat.requests}) == 3


async def test_llm_proposer_gives_up_after_its_retries(make_context, scripted_chat):
    ctx = make_context(max_steps=2, action_mode="text")
    start = await reset(ctx, seed=0)
    chat = scripted_chat(replies=["nonsense"] * 5)
    proposer = LLMProposer(chat, max_retries=1)
    proposal = await proposer.propose(
        start.observation, round=0, check=lambda r: project_action(ctx, start.state, r)
    )
    assert proposal.response == "nonsense" and proposal.attempts == 2 and len(chat.replies) == 3


class _Interrupt(Exception):
    pass


class InterruptingProposer(RandomProposer):
    """The random proposer, interrupted (as by Ctrl-C) when asked for round ``stop``."""

    def __init__(self, seed: int, stop: int) -> None:
        super().__init__(seed)
        self.stop = stop

    async def propose(self, observation, *, round, check):
        if round == self.stop:
            raise _Interrupt
        return await super().propose(observation, round=round, check=check)


async def test_an_interrupted_run_resumes_to_the_same_result(make_context, executor, tmp_path):
    whole = RunDirectory(tmp_path / "whole")
    ctx = make_context(selection="aflow")
    reference = await run_search(ctx, RandomProposer(5), whole, rounds=8, seed=2)
    assert reference.step == 8 and reference.done_reason == "max_steps"

    parts = RunDirectory(tmp_path / "parts")
    with pytest.raises(_Interrupt):
        await run_search(make_context(), InterruptingProposer(5, stop=3), parts, rounds=8, seed=2)
    calls = len(executor.calls)
    resumed = await run_search(make_context(), RandomProposer(5), parts, rounds=8, seed=2)
    assert resumed.model_copy(update={"episode_id": "whole"}) == reference
    rounds = parts.rounds()
    assert [r["round"] for r in rounds] == list(range(9))
    # The resumed part evaluated only the rounds it made.
    assert len(executor.calls) - calls == sum(r["executor_calls"] for r in rounds[4:])
    assert [r["action"] for r in rounds] == [r["action"] for r in whole.rounds()]
    # Asking for more rounds extends the finished run.
    longer = await run_search(make_context(), RandomProposer(5), parts, rounds=10, seed=2)
    assert longer.step == 10 and longer.attempts[:8] == reference.attempts
    tree = json.loads((tmp_path / "parts" / "tree.json").read_text())
    assert tree["rounds"] == 10 and len(tree["nodes"]) == len(longer.nodes)
    best = tmp_path / "parts" / "best"
    for name in ("workflow.json", "graph.py", "prompt.py", "workflow.svg", "workflow.png"):
        assert (best / name).is_file(), name
    assert "class Workflow" in (best / "graph.py").read_text()


async def test_fused_anchor_mc_values_are_rebuilt_on_resume(make_context, tmp_path):
    from aflowrl.search import AnchorMonteCarlo

    table = AnchorMonteCarlo()
    ctx = make_context(selection="fused", value_source="anchor-mc", values=table)
    state = await run_search(ctx, RandomProposer(1), RunDirectory(tmp_path), rounds=4, seed=0)
    fresh = AnchorMonteCarlo()
    resumed = make_context(selection="fused", value_source="anchor-mc", values=fresh)
    again = await run_search(resumed, RandomProposer(1), RunDirectory(tmp_path), rounds=4, seed=0)
    assert again == state
    root = state.nodes[0].hash
    assert fresh.to_dict() == table.to_dict() and fresh.count(root) >= 1


async def test_rounds_past_the_saved_state_are_dropped_on_resume(make_context, tmp_path):
    run_dir = RunDirectory(tmp_path)
    await run_search(make_context(), RandomProposer(0), run_dir, rounds=2, seed=0)
    with (tmp_path / "rounds.jsonl").open("a") as out:  # a round the state never saw, torn
        out.write(json.dumps({"round": 3, "action": "ghost"}) + "\n" + '{"round": 4, "act')
    state = run_dir.load_state()
    assert state is not None and state.step == 2
    assert [r["round"] for r in run_dir.rounds()] == [0, 1, 2]


async def test_the_best_workflows_files_name_it_and_the_edits_that_made_it(make_context, tmp_path):
    run_dir = RunDirectory(tmp_path)
    state = await run_search(make_context(), RandomProposer(0), run_dir, rounds=3, seed=0)
    edited = max(i for i, n in enumerate(state.nodes) if n.action is not None)
    nodes = list(state.nodes)
    nodes[edited] = nodes[edited].model_copy(update={"score": 1.0})  # the best, for this test
    state = state.model_copy(update={"nodes": tuple(nodes)})
    chain, index = [], edited
    while state.nodes[index].action is not None:
        chain.append(state.nodes[index].action)
        index = state.nodes[index].parent
    best = json.loads((run_dir.write_best(state) / "workflow.json").read_text())
    assert best["name"] == f"{state.benchmark}-{state.nodes[edited].hash[:12]}"
    assert "; ".join(reversed(chain)) in best["description"]
    seed = state.nodes[0].graph
    assert f"edited from '{seed['name']}'" in best["description"]
