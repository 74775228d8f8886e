"""Collection without lockstep: each episode acts and steps on its own, decisions are batched from
whatever is waiting, and nothing collected depends on the order in which steps return.

The environment is a test double that holds every Step until each live episode has one waiting,
then answers some of them in an order given by its own seed: different seeds interleave the
episodes (and compose the actor's batches) differently, without any clock.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
from collections.abc import Sequence

import pytest

from aflowrl._proto.v1 import environment_pb2 as pb
from aflowrl._proto.v1 import rollout_pb2
from aflowrl.config import RunSpec
from aflowrl.errors import FailedPreconditionError
from aflowrl.search import encoding
from aflowrl.trainer.acting import Actor, Draw, Observed, TextActor
from aflowrl.trainer.clock import Timeline
from aflowrl.trainer.collect import Collector, batch_summary, seed_workflows
from aflowrl.trainer.rows import Decision
from aflowrl.trainer.values import ValueTable

MAX_STEPS = 3
ACTIONS = ("add Review after generate", "remove review", "set_samples generate n=3")
SPEC = RunSpec.from_yaml(
    f"""
policy: {{value: {{enabled: true}}}}
environment:
  search: {{maxSteps: {MAX_STEPS}, selection: fused, valueSource: policy}}
trainer: {{tasksPerIteration: 2, groupSize: 3, seed: 5}}
learner: {{loss: {{miniBatchSize: 6, microBatchSize: 6}}}}
"""
)


def _digest(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _resampled(child: str) -> float | None:
    """The double's second reading of a child's reward: for children whose hash starts with
    0-7, the reward plus a shift drawn from the hash; None for the others."""
    if child[0] not in "01234567":
        return None
    return int(child[:4], 16) / 0xFFFF - 0.5 + (int(child[4:8], 16) / 0xFFFF - 0.5) / 10


class OrderedEnv:
    """Answers Steps once every live episode waits on one, ``release`` of them per turn, in an
    order drawn from ``order_seed`` (or, with ``order_seed=None``, all at once in episode order:
    lockstep). Records the values every request carried."""

    def __init__(self, episodes: int, order_seed: int | None) -> None:
        self.live = episodes
        self.order = random.Random(order_seed) if order_seed is not None else None
        self.waiting: list[tuple[str, asyncio.Future[None]]] = []
        self.sent: dict[tuple[str, int], tuple[dict[str, float], float]] = {}

    async def refresh(self) -> list[str]:
        return ["ordered"]

    def _observation(self, state: dict) -> pb.Observation:
        return pb.Observation(
            text=f"step {state['step']} at {state['anchor']}",
            admissible_actions=list(ACTIONS),
            anchor=state["anchor"],
        )

    async def reset(self, request: pb.ResetRequest, *, key: str) -> pb.ResetResponse:
        state = {"id": request.episode_id, "step": 0, "anchor": _digest(request.seed)}
        self.sent[(request.episode_id, -1)] = (
            dict(request.values.values),
            request.values.default_value,
        )
        return pb.ResetResponse(
            state=json.dumps(state).encode(), observation=self._observation(state), seed_score=0.5
        )

    def _release(self) -> None:
        if not self.waiting or len(self.waiting) < self.live:
            return
        if self.order is None:
            chosen, self.waiting = self.waiting, []
        else:
            self.order.shuffle(self.waiting)
            count = self.order.randint(1, len(self.waiting))
            chosen, self.waiting = self.waiting[:count], self.waiting[count:]
        for _, future in chosen:
            future.set_result(None)

    async def step(
        self,
        state_blob: bytes,
        action: str,
        *,
        episode_key: str,
        values: pb.StateValues | None = None,
    ) -> tuple[pb.StepResponse, str]:
        state = json.loads(state_blob)
        assert values is not None
        self.sent[(episode_key, state["step"])] = (dict(values.values), values.default_value)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append((episode_key, future))
        self._release()
        await future
        child = _digest(state["anchor"], action)
        reward = int(child[:4], 16) / 0xFFFF - 0.5
        state = {**state, "step": state["step"] + 1, "anchor": child}
        done = state["step"] >= MAX_STEPS
        if done:
            self.live -= 1
            self._release()
        reply = pb.StepResponse(
            state=b"" if done else json.dumps(state).encode(),
            observation=pb.Observation() if done else self._observation(state),
            reward=reward,
            done=done,
            info=pb.StepInfo(
                valid_action=True,
                child_hash=child,
                resampled=_resampled(child) is not None,
                resampled_reward=_resampled(child) or 0.0,
            ),
        )
        return reply, "ordered"


class SeededActor(Actor):
    """Chooses and values with each decision's own generator; records its batches."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    async def act(self, observed: Sequence[Observed], *, draws: Sequence[Draw]) -> list[Decision]:
        self.batches.append(len(observed))
        await asyncio.sleep(0)  # a call takes at least a turn of the loop
        decisions = []
        for o, draw in zip(observed, draws, strict=True):
            k = int(draw.rng.integers(len(o.admissible)))
            value = float(draw.rng.random())
            decisions.append(Decision(action=encoding.action_reply(o.admissible[k]), value=value))
        return decisions


async def _collect(order_seed: int | None, iteration: int = 3):
    env = OrderedEnv(SPEC.trainer.tasks_per_iteration * SPEC.trainer.group_size, order_seed)
    actor = SeededActor()
    table = ValueTable("policy")
    table.observe("earlier", 0.25)  # from an earlier iteration
    collector = Collector(
        SPEC,
        env,  # type: ignore[arg-type]
        actor,
        seed_workflows(SPEC.environment.training_benchmarks),
        values=table,
    )
    timeline = Timeline()
    batch = await collector.collect(iteration, timeline)
    rows = [
        (r.traj, r.step, r.anchor, r.decision.action, r.decision.value, r.reward, r.child_hash)
        for r in batch.rows
    ]
    return rows, env.sent, table.to_dict(), actor.batches, timeline


async def test_the_order_in_which_steps_return_does_not_change_the_batch():
    lockstep = await _collect(None)
    others = [await _collect(seed) for seed in (1, 2, 3)]
    rows, sent, table, batches, _ = lockstep
    assert len(rows) == 6 * MAX_STEPS and batches == [6] * MAX_STEPS
    for other_rows, other_sent, other_table, _, _ in others:
        assert other_rows == rows
        assert other_sent == sent  # every Reset and Step carried the same V(s)
        assert other_table == table
    # The orders did differ: the actor's batches were composed differently.
    assert len({tuple(batches)} | {tuple(o[3]) for o in others}) > 1
    # Another iteration draws other choices.
    assert (await _collect(1, iteration=4))[0] != rows


async def test_a_step_carries_the_table_at_the_start_plus_its_own_episodes_values():
    rows, sent, table, _, timeline = await _collect(2)
    by_episode: dict[int, list] = {}
    for row in rows:
        by_episode.setdefault(row[0], []).append(row)
    for traj, own in by_episode.items():
        episode_id = f"it3-g{traj // 3}-e{traj % 3}"
        assert sent[(episode_id, -1)] == ({"earlier": 0.25}, 0.25)
        for _, step, anchor, _, value, _, _ in own:
            values, default = sent[(episode_id, step)]
            mine = {r[2]: r[4] for r in own if r[1] <= step}
            assert values == {"earlier": 0.25, **mine}, (traj, step)
            assert default == pytest.approx(sum(values.values()) / len(values))
            assert values[anchor] == value
    # After the collection, the table holds every episode's values, added in step then episode
    # order (an anchor seen again moves to the end).
    expected = {"earlier": 0.25}
    for _, _, anchor, _, value, _, _ in sorted(rows, key=lambda r: (r[1], r[0])):
        expected.pop(anchor, None)
        expected[anchor] = value
    assert table["estimates"] == expected and list(table["estimates"]) == list(expected)
    record = timeline.record()
    assert record["time/generate"] > 0 and record["time/step"] > 0


class EndlessEnv(OrderedEnv):
    async def step(self, state_blob, action, *, episode_key, values=None):
        reply, replica = await super().step(
            state_blob, action, episode_key=episode_key, values=values
        )
        reply.done = False
        reply.state = state_blob
        reply.observation.CopyFrom(self._observation(json.loads(state_blob)))
        return reply, replica


async def test_an_episode_the_environment_never_ends_stops_the_collection():
    env = EndlessEnv(6, order_seed=None)
    env.live = 10**6  # never wait for the others: release each Step at once
    collector = Collector(
        SPEC,
        env,  # type: ignore[arg-type]
        SeededActor(),
        seed_workflows(SPEC.environment.training_benchmarks),
        values=ValueTable("policy"),
    )

    def release_at_once() -> None:
        for _, future in env.waiting:
            future.set_result(None)
        env.waiting = []

    env._release = release_at_once  # type: ignore[method-assign]
    with pytest.raises(FailedPreconditionError, match="did not end episode"):
        await collector.collect(0, Timeline())


class SeedEchoRollout:
    """Generates, for each prompt, a completion naming the seed it was sampled with."""

    async def generate(self, prompts, sampling, *, seeds=()):
        assert len(seeds) == len(prompts) and not sampling.HasField("seed")
        return [
            (
                rollout_pb2.PromptCompletions(
                    completions=[rollout_pb2.Completion(text=f"seed {seed}", token_ids=[1])]
                ),
                7,
            )
            for seed in seeds
        ]


async def test_text_mode_seeds_each_prompt_with_its_own_decisions_seed():
    spec = SPEC.model_copy(deep=True)
    actor = TextActor(SeedEchoRollout(), spec)  # type: ignore[arg-type]
    first, second = Observed("a", ACTIONS), Observed("b", ACTIONS)
    draws = [Draw.of(5, 3, 0, 1), Draw.of(5, 3, 1, 1)]
    together = await actor.act([first, second], draws=draws)
    alone = await actor.act([second], draws=draws[1:])
    assert [d.action for d in together] == [f"seed {draws[0].seed}", f"seed {draws[1].seed}"]
    assert alone[0].action == together[1].action and draws[0].seed != draws[1].seed


class ChoosingActor(SeededActor):
    """:class:`SeededActor` whose decisions are choices among the listed actions."""

    async def act(self, observed: Sequence[Observed], *, draws: Sequence[Draw]) -> list[Decision]:
        decisions = await super().act(observed, draws=draws)
        out = []
        for o, d in zip(observed, decisions, strict=True):
            chosen = [encoding.action_reply(a) for a in o.admissible].index(d.action)
            count = len(o.admissible)
            out.append(
                Decision(
                    action=d.action,
                    candidate_ids=tuple((k + 1,) for k in range(count)),
                    chosen=chosen,
                    logprobs=(-1.0986,),
                    candidate_logprobs=(-1.0986,) * count,
                    value=d.value,
                )
            )
        return out


async def _collect_choices(*, siblings: bool, order_seed: int):
    doc = SPEC.to_document()
    doc["learner"]["algorithm"] = {"type": "gigpo", "siblingStepGroups": siblings}
    spec = RunSpec.from_document(doc)
    env = OrderedEnv(spec.trainer.tasks_per_iteration * spec.trainer.group_size, order_seed)
    stepped: list[tuple[str, str]] = []
    step = env.step

    async def recording_step(state_blob, action, **kwargs):
        stepped.append((json.loads(state_blob)["anchor"], action))
        return await step(state_blob, action, **kwargs)

    env.step = recording_step  # type: ignore[method-assign]
    collector = Collector(
        spec,
        env,  # type: ignore[arg-type]
        ChoosingActor(),
        seed_workflows(spec.environment.training_benchmarks),
        values=ValueTable("policy"),
    )
    batch = await collector.collect(3, Timeline())
    return batch, stepped


async def test_sibling_step_groups_step_every_listed_action_without_moving_the_episodes():
    plain, plain_steps = await _collect_choices(siblings=False, order_seed=1)
    with_siblings, sibling_steps = await _collect_choices(siblings=True, order_seed=2)
    # The episodes are the same: siblings answer "what if", they take no step.
    assert [(r.traj, r.step, r.anchor, r.decision.action, r.reward) for r in plain.rows] == [
        (r.traj, r.step, r.anchor, r.decision.action, r.reward) for r in with_siblings.rows
    ]
    assert all(not r.candidate_rewards for r in plain.rows)
    assert len(sibling_steps) == len(plain_steps) * len(ACTIONS)
    for row in with_siblings.rows:
        replies = [encoding.action_reply(a) for a in ACTIONS]
        # One reward per listed action, what the environment answers for it from that state.
        expected = [int(_digest(row.anchor, a)[:4], 16) / 0xFFFF - 0.5 for a in replies]
        assert row.candidate_rewards == pytest.approx(expected)
        assert row.candidate_rewards[row.decision.chosen] == row.reward
        assert row.candidate_children == tuple(_digest(row.anchor, a) for a in replies)


async def test_each_row_keeps_the_pairs_of_readings_of_its_step_and_its_siblings():
    batch, _ = await _collect_choices(siblings=True, order_seed=3)
    replies = [encoding.action_reply(a) for a in ACTIONS]
    pairs = []
    for row in batch.rows:
        children = [row.child_hash] + [
            _digest(row.anchor, a) for k, a in enumerate(replies) if k != row.decision.chosen
        ]
        expected = tuple(
            (int(c[:4], 16) / 0xFFFF - 0.5, _resampled(c))
            for c in children
            if _resampled(c) is not None
        )
        assert [x for pair in row.reward_pairs for x in pair] == pytest.approx(
            [x for pair in expected for x in pair]
        )
        pairs.extend(expected)
    assert len(pairs) >= 4
    record = batch_summary(batch)
    assert record["noise/resampled_steps"] == len(pairs)
    assert record["noise/reward_noise_sd"] == pytest.approx(
        math.sqrt(sum((a - b) ** 2 for a, b in pairs) / len(pairs) / 2)
    )
