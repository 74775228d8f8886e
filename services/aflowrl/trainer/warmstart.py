"""Supervised warm start from labelled search traces (``trainer.warmStart``), before RL.

A small policy trained by RL alone from random weights learns which *position* of a list tends
to pay, not how to read a workflow: the reward of one sampled action per state is a weak, noisy
signal. The environment can say much more: it keeps no state, so from one state blob every
listed action can be stepped, each child evaluated once (and cached by its hash). A labelled
trace is therefore a state with the reward of *every* candidate:

1. a behaviour policy (``uniform`` over the admissible actions, or the ``policy`` itself) plays
   ``warmStart.episodes`` episodes, each on its own task (benchmarks drawn by weight as the
   iterations' are, task seeds from a namespace of their own); at every state the rollout
   scores the observation (the policy's own decision, which also gives the token ids the
   learner trains on), and every admissible action is stepped from the state: r_k is the
   reward of candidate k (a duplicate's is the duplicate penalty); the behaviour's action then
   moves the episode on. The episodes move in rounds (one rollout call for all, then their
   labelling steps), and each state draws on its own randomness
   (:class:`aflowrl.trainer.acting.Draw` of the run seed, episode and step), so the labels do
   not depend on which step returned first;
2. each labelled state becomes a supervised row: the target q_k = softmax_k(r_k / tau) over its
   candidates (tau = ``warmStart.temperature``, in reward units) and the value target
   sum_k q_k r_k, the reward the target policy expects from the state;
3. the learner trains on the rows with ``OBJECTIVE_SFT`` (cross-entropy to q; the value replies
   towards their target) for ``warmStart.epochs`` passes, and the new weights are pushed.

The traces are written to ``<run>/warmstart/traces.jsonl`` (observation, actions, rewards,
duplicates), so they can be inspected or reused. Called by :mod:`aflowrl.trainer.loop` before
the first iteration of a fresh run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aflowrl.config import RunSpec
from aflowrl.search import encoding
from aflowrl.trainer.acting import Actor, Draw, Observed
from aflowrl.trainer.clients import EnvironmentClient, LearnerClient, TrainRow
from aflowrl.trainer.clock import Timeline
from aflowrl.trainer.collect import Collector, group_episodes
from aflowrl.trainer.rows import Decision, Episode
from aflowrl.trainer.tasks import warm_start_tasks

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LabelledState:
    """One state of a behaviour episode with the reward of every admissible action."""

    benchmark: str
    episode_id: str
    step: int
    observation: str
    actions: tuple[str, ...]
    rewards: tuple[float, ...]
    duplicates: tuple[bool, ...]
    decision: Decision
    """The policy's scoring of the observation (its token ids are what the learner trains)."""

    def to_json(self) -> str:
        return json.dumps(
            {
                "benchmark": self.benchmark,
                "episode": self.episode_id,
                "step": self.step,
                "observation": self.observation,
                "actions": list(self.actions),
                "rewards": list(self.rewards),
                "duplicates": list(self.duplicates),
            },
            ensure_ascii=False,
        )


def target_distribution(rewards: Sequence[float], temperature: float) -> list[float]:
    """q_k = softmax_k(r_k / tau)."""
    scaled = np.asarray(rewards, dtype=np.float64) / temperature
    weights = np.exp(scaled - scaled.max())
    return (weights / weights.sum()).tolist()  # type: ignore[no-any-return]


def supervised_rows(states: Sequence[LabelledState], temperature: float) -> list[TrainRow]:
    """The learner's rows of the labelled states (module docstring, step 2)."""
    rows = []
    for state in states:
        q = target_distribution(state.rewards, temperature)
        value = math.fsum(w * r for w, r in zip(q, state.rewards, strict=True))
        rows.append(
            TrainRow(
                state.decision,
                old_logprobs=(),
                advantages=(),
                value_target=value if state.decision.value_ids else None,
                target_weights=tuple(q),
            )
        )
    return rows


class WarmStart:
    """Labels behaviour episodes and trains the policy on them (module docstring)."""

    def __init__(
        self,
        spec: RunSpec,
        collector: Collector,
        actor: Actor,
        env: EnvironmentClient,
        learner: LearnerClient,
    ) -> None:
        self.spec = spec
        self.settings = spec.trainer.warm_start
        self.collector = collector
        self.actor = actor
        self.env = env
        self.learner = learner

    async def label(self, timeline: Timeline) -> list[LabelledState]:
        """Play and label ``warmStart.episodes`` behaviour episodes."""
        tasks = warm_start_tasks(self.spec, self.settings.episodes)
        episodes = group_episodes(tasks, 1, "warm")
        with timeline.phase("reset"):
            await self.collector.reset_all(episodes, timeline)
        seed = self.spec.trainer.seed
        states: list[LabelledState] = []
        step = 0
        while active := [e for e in episodes if not e.done and e.admissible]:
            observed = [Observed(e.observation_text, e.admissible) for e in active]
            draws = [Draw.of(seed, "warm", e.traj, step) for e in active]
            with timeline.phase("generate"):
                decisions = await self.actor.act(observed, draws=draws)
            with timeline.phase("step"):
                labelled = await asyncio.gather(
                    *(
                        self._label(e, d, step, draw.rng)
                        for e, d, draw in zip(active, decisions, draws, strict=True)
                    )
                )
            states.extend(labelled)
            step += 1
        return states

    async def _label(
        self, episode: Episode, decision: Decision, step: int, rng: np.random.Generator
    ) -> LabelledState:
        actions = episode.admissible
        replies = await asyncio.gather(
            *(
                self.env.step(
                    episode.state,
                    encoding.action_reply(action),
                    episode_key=episode.episode_id,
                    values=self.collector.state_values(),
                )
                for action in actions
            )
        )
        rewards = tuple(float(reply.reward) for reply, _ in replies)
        duplicates = tuple(bool(reply.info.duplicate) for reply, _ in replies)
        state = LabelledState(
            benchmark=episode.benchmark,
            episode_id=episode.episode_id,
            step=step,
            observation=episode.observation_text,
            actions=actions,
            rewards=rewards,
            duplicates=duplicates,
            decision=decision,
        )
        if self.settings.behaviour == "policy" and decision.chosen >= 0:
            chosen = decision.chosen
        else:
            chosen = int(rng.integers(len(actions)))
        reply, _ = replies[chosen]
        self.collector.advance(episode, reply)
        return state

    async def run(self, run_dir: Path, iteration: int, timeline: Timeline) -> dict[str, Any]:
        """Label, write the traces, train; returns the warm start's scalars."""
        states = await self.label(timeline)
        out = run_dir / "warmstart"
        out.mkdir(parents=True, exist_ok=True)
        (out / "traces.jsonl").write_text("".join(s.to_json() + "\n" for s in states))
        trainable = [s for s in states if s.decision.is_choice]
        if not trainable:
            raise ValueError("the warm start labelled no choice-mode state to train on")
        rows = supervised_rows(trainable, self.settings.temperature)
        metrics: dict[str, float] = {}
        version = 0
        with timeline.phase("train"):
            for epoch in range(self.settings.epochs):
                metrics, version = await self.learner.train(rows, iteration, supervised=True)
                logger.info(
                    "warm start epoch %d: loss %.4f (value MAE %.4f)",
                    epoch + 1,
                    metrics.get("losses/policy", math.nan),
                    metrics.get("charts/value_mae", math.nan),
                )
        best = [max(s.rewards) for s in states]
        mean = [sum(s.rewards) / len(s.rewards) for s in states]
        return {
            "warmstart/states": float(len(states)),
            "warmstart/mean_reward": float(np.mean(mean)),
            "warmstart/best_reward": float(np.mean(best)),
            "warmstart/loss": metrics.get("losses/policy", math.nan),
            "warmstart/value_mae": metrics.get("charts/value_mae", math.nan),
            "warmstart/policy_version": float(version),
        }
