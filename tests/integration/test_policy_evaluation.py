"""``aflowrl.trainer.evaluate``: a policy played on chosen tasks, nothing trained.

A real environment replica (in this process, surrogate executor, AFlow's split files) serves
GSM8K and DROP; the actors are the trainer's :class:`UniformActor` and a fixed-choice actor
(a policy that always answers the same number, so its episodes can be replayed by hand through
the same gRPC calls: the oracle the results are checked against).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aflowrl._proto.v1 import environment_pb2 as pb
from aflowrl.config import RunSpec
from aflowrl.envsvc.server import running_server
from aflowrl.errors import InvalidInputError
from aflowrl.search import encoding
from aflowrl.trainer.acting import Actor, Draw, IndexActor, Observed, UniformActor
from aflowrl.trainer.clients import EnvironmentClient
from aflowrl.trainer.evaluate import (
    EpisodeResult,
    evaluate_policy,
    play_episodes,
    policy_table,
    summarize,
)
from aflowrl.trainer.rows import Decision
from aflowrl.trainer.tasks import Task, held_out_tasks
from aflowrl.workflow import library

MAX_STEPS = 3


class Unlisted(Actor):
    """Always an action the observation does not list (every step an invalid no-op)."""

    async def act(self, observed: Sequence[Observed], *, draws: Sequence[Draw]) -> list[Decision]:
        return [Decision(action=encoding.action_reply("no such action")) for _ in observed]


def _spec(data: Path) -> RunSpec:
    return RunSpec.model_validate(
        {
            "environment": {
                "benchmarks": ["gsm8k"],
                "heldOutBenchmarks": ["drop"],
                "data": {"dir": str(data)},
                "evaluation": {"maxProblems": 5, "repeats": 1},
                "search": {
                    "maxSteps": MAX_STEPS,
                    "maxAdmissibleActions": 9,
                    "selection": "ucb",
                    "valueSource": "none",
                },
            },
            "trainer": {"tasksPerIteration": 2, "groupSize": 2},
            "learner": {"loss": {"miniBatchSize": 8, "microBatchSize": 8}},
        }
    )


async def _replay(env: EnvironmentClient, task: Task, k: int) -> dict[str, Any]:
    """The fixed-choice episode by hand: Reset, then Step the same number until done."""
    seed = library.load("seed", "math" if task.benchmark == "gsm8k" else "qa")
    reply = await env.reset(
        pb.ResetRequest(
            task=task.benchmark,
            seed=task.seed,
            max_steps=MAX_STEPS,
            action_mode=pb.ACTION_MODE_CHOICE,
            seed_workflow_json=seed.to_json(indent=None),
        ),
        key=seed.content_hash,
    )
    state, rewards, best = reply.state, [], reply.seed_score
    listed = list(reply.observation.admissible_actions)
    duplicates = invalid = 0
    while True:
        action = encoding.action_reply(listed[min(k, len(listed) - 1)])
        step, _ = await env.step(state, action, episode_key="replay")
        rewards.append(step.reward)
        best = max(best, step.info.best_score)
        duplicates += step.info.valid_action and step.info.duplicate
        invalid += not step.info.valid_action
        state, listed = step.state, list(step.observation.admissible_actions)
        if step.done:
            break
    return {
        "episode_return": math.fsum(rewards),
        "seed_score": reply.seed_score,
        "best_score": best,
        "steps": len(rewards),
        "duplicates": duplicates,
        "invalid_steps": invalid,
    }


async def test_episodes_of_a_fixed_policy_match_a_replay_by_hand(aflow_data):
    spec = _spec(aflow_data)
    async with running_server(spec, host="127.0.0.1", port=0, metrics_port=None) as server:
        env = EnvironmentClient([f"127.0.0.1:{server.port}"])
        try:
            tasks = [Task("gsm8k", 7), Task("drop", 2**31 + 5)]
            results = await evaluate_policy(spec, env, IndexActor(1), tasks, episodes_per_task=2)
            assert [(r.benchmark, r.seed) for r in results] == [
                ("gsm8k", 7),
                ("gsm8k", 7),
                ("drop", 2**31 + 5),
                ("drop", 2**31 + 5),
            ]
            for task, result in zip([t for t in tasks for _ in range(2)], results, strict=True):
                replayed = await _replay(env, task, 1)
                got = {key: getattr(result, key) for key in replayed}
                assert got == pytest.approx(replayed)
            # An action the observation does not list: every step is an invalid no-op.
            invalid = await evaluate_policy(spec, env, Unlisted(), tasks[:1])
            assert invalid[0].invalid_steps == invalid[0].steps == MAX_STEPS
            assert invalid[0].episode_return == 0.0
        finally:
            await env.close()


async def test_played_episodes_keep_every_steps_row_and_summarise_as_the_evaluation(aflow_data):
    spec = _spec(aflow_data)
    async with running_server(spec, host="127.0.0.1", port=0, metrics_port=None) as server:
        env = EnvironmentClient([f"127.0.0.1:{server.port}"])
        try:
            tasks = [Task("gsm8k", 7), Task("drop", 11)]
            episodes = await play_episodes(spec, env, IndexActor(2), tasks, seed=4)
            results = await evaluate_policy(spec, env, IndexActor(2), tasks, seed=4)
        finally:
            await env.close()
    assert [EpisodeResult.of(e) for e in episodes] == results
    for episode in episodes:
        assert [r.step for r in episode.rows] == list(range(MAX_STEPS))
        # Each step modifies the workflow its anchor names and says what it added.
        assert all(r.anchor and (r.duplicate or r.child_hash) for r in episode.rows if r.valid)
        added = [r.child_score for r in episode.rows if r.valid and not r.duplicate]
        expected = max(added) - episode.seed_score if added else 0.0
        assert episode.best_gain == pytest.approx(expected)


async def test_a_seeded_evaluation_repeats_and_refuses_unserved_tasks(aflow_data):
    spec = _spec(aflow_data)
    async with running_server(spec, host="127.0.0.1", port=0, metrics_port=None) as server:
        env = EnvironmentClient([f"127.0.0.1:{server.port}"])
        try:
            tasks = held_out_tasks(["gsm8k", "drop"], 2, seed=3)
            first = await evaluate_policy(
                spec, env, UniformActor(), tasks, episodes_per_task=2, seed=9
            )
            again = await evaluate_policy(
                spec, env, UniformActor(), tasks, episodes_per_task=2, seed=9
            )
            assert first == again and len(first) == 8
            assert all(r.steps == MAX_STEPS for r in first)
            with pytest.raises(InvalidInputError) as caught:
                await evaluate_policy(spec, env, UniformActor(), [*tasks, Task("mbpp", 1)])
            assert caught.value.field == "tasks[4].benchmark"
            with pytest.raises(InvalidInputError) as caught:
                await evaluate_policy(spec, env, UniformActor(), tasks, episodes_per_task=0)
            assert caught.value.field == "episodes_per_task"
            assert await evaluate_policy(spec, env, UniformActor(), []) == []
        finally:
            await env.close()
    summaries = summarize(first, held_out=["drop"])
    assert [(s.benchmark, s.held_out, s.episodes) for s in summaries] == [
        ("gsm8k", False, 4),
        ("drop", True, 4),
    ]
    for summary in summaries:
        mine = [r for r in first if r.benchmark == summary.benchmark]
        returns = np.array([r.episode_return for r in mine])
        assert summary.episode_return == pytest.approx(returns.mean())
        assert summary.episode_return_se == pytest.approx(returns.std(ddof=1) / 2.0)
        assert summary.best_score == pytest.approx(np.mean([r.best_score for r in mine]))
        assert summary.invalid_ratio == pytest.approx(
            sum(r.invalid_steps for r in mine) / sum(r.steps for r in mine)
        )
    table = policy_table(summaries, title="held-out tasks").splitlines()
    assert table[0] == "held-out tasks" and table[5].startswith("drop (held out)")
