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
   towards their target) for ``warmStart.epochs`` passes, and the new weights are pushed;
4. with ``warmStart.validationEpisodes``, as many more behaviour episodes are labelled on tasks
   of the held-out problem pool and never trained on; after every epoch the policy's fit to
   their states is measured (:func:`fit_of`: cross-entropy to q, top-1 agreement with the best
   action, expected reward against the best and uniform ones), so an underfit or overfit warm
   start shows in ``warm_start.json``.

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
from aflowrl.trainer.acting import Actor, Draw
from aflowrl.trainer.clients import EnvironmentClient, LearnerClient, TrainRow
from aflowrl.trainer.clock import Timeline
from aflowrl.trainer.collect import Collector, group_episodes
from aflowrl.trainer.rows import Decision, Episode
from aflowrl.trainer.tasks import Task, validation_tasks, warm_start_tasks

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
    task: tuple[str, int, str] = ("", 0, "all")
    """The episode's task: benchmark, task seed, problem pool."""
    children: tuple[str, ...] = ()
    """The workflow hash each action leads to."""
    executor_calls: int = 0
    """Executor calls the labelling Steps made (what the cache did not have)."""

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


def labelled_evaluations(states: Sequence[LabelledState]) -> int:
    """Distinct (task, workflow) evaluations the labelling needed (duplicates evaluate
    nothing; the same child of one task is evaluated once): the budget unit of
    :func:`aflowrl.trainer.collect.workflow_evaluations`."""
    return len(
        {
            (*s.task, child)
            for s in states
            for child, duplicate in zip(s.children, s.duplicates, strict=True)
            if child and not duplicate
        }
    )


def fit_of(
    states: Sequence[LabelledState], log_pi: Sequence[Sequence[float]], temperature: float
) -> dict[str, float]:
    """A policy's fit to labelled states, from its log pi over each state's candidates.

    - ``cross_entropy``: mean over states of -sum_k q_k log pi_k, q = softmax(r / tau);
    - ``top1``: share of states whose most likely action has the best reward (ties count);
    - ``expected_reward``: mean of sum_k pi_k r_k; beside it ``best_reward`` (mean max_k r_k)
      and ``uniform_reward`` (mean of the rewards' mean), the ceiling and random's level.
    """
    if len(log_pi) != len(states):
        raise ValueError(f"{len(log_pi)} distributions for {len(states)} states")
    ce, top1, expected, best, uniform = [], [], [], [], []
    for state, values in zip(states, log_pi, strict=True):
        rewards = np.asarray(state.rewards, dtype=np.float64)
        log_p = np.asarray(values, dtype=np.float64)
        if log_p.shape != rewards.shape:
            raise ValueError(f"{log_p.size} log-probabilities for {rewards.size} candidates")
        q = np.asarray(target_distribution(state.rewards, temperature), dtype=np.float64)
        ce.append(float(-(q * log_p).sum()))
        top1.append(float(rewards[int(np.argmax(log_p))] >= rewards.max() - 1e-12))
        expected.append(float((np.exp(log_p) * rewards).sum()))
        best.append(float(rewards.max()))
        uniform.append(float(rewards.mean()))
    return {
        "cross_entropy": float(np.mean(ce)),
        "top1": float(np.mean(top1)),
        "expected_reward": float(np.mean(expected)),
        "best_reward": float(np.mean(best)),
        "uniform_reward": float(np.mean(uniform)),
    }


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

    async def label(
        self, timeline: Timeline, tasks: Sequence[Task] | None = None, prefix: str = "warm"
    ) -> list[LabelledState]:
        """Play and label a behaviour episode on each of ``tasks`` (default: the
        ``warmStart.episodes`` training tasks)."""
        if tasks is None:
            tasks = warm_start_tasks(self.spec, self.settings.episodes)
        episodes = group_episodes(tasks, 1, prefix)
        with timeline.phase("reset"):
            await self.collector.reset_all(episodes, timeline)
        seed = self.spec.trainer.seed
        states: list[LabelledState] = []
        step = 0
        while active := [e for e in episodes if not e.done and e.admissible]:
            observed = [e.observed() for e in active]
            draws = [Draw.of(seed, prefix, e.traj, step) for e in active]
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
        stepped = await self.collector.step_each(
            episode.state,
            actions,
            episode_key=episode.episode_id,
            values=self.collector.state_values(),
        )
        replies = [reply for reply in stepped if reply is not None]
        rewards = tuple(float(reply.reward) for reply in replies)
        duplicates = tuple(bool(reply.info.duplicate) for reply in replies)
        children = tuple(reply.info.child_hash for reply in replies)
        calls = sum(int(reply.info.executor_calls) for reply in replies)
        state = LabelledState(
            benchmark=episode.benchmark,
            episode_id=episode.episode_id,
            step=step,
            observation=episode.observation_text,
            actions=actions,
            rewards=rewards,
            duplicates=duplicates,
            decision=decision,
            task=(episode.benchmark, episode.seed, episode.pool),
            children=children,
            executor_calls=calls,
        )
        if self.settings.behaviour == "policy" and decision.chosen >= 0:
            chosen = decision.chosen
        else:
            chosen = int(rng.integers(len(actions)))
        self.collector.advance(episode, replies[chosen])
        return state

    async def run(self, run_dir: Path, iteration: int, timeline: Timeline) -> dict[str, Any]:
        """Label, write the traces, train; returns the warm start's scalars (with
        ``validationEpisodes``, its fit on their states after every epoch: ``epochs`` in the
        summary, ``warmstart/val_*`` after the last)."""
        states = await self.label(timeline)
        validation: list[LabelledState] = []
        if self.settings.validation_episodes > 0:
            tasks = validation_tasks(self.spec, self.settings.validation_episodes)
            validation = await self.label(timeline, tasks, prefix="warm-val")
        out = run_dir / "warmstart"
        out.mkdir(parents=True, exist_ok=True)
        (out / "traces.jsonl").write_text("".join(s.to_json() + "\n" for s in states))
        if validation:
            (out / "validation.jsonl").write_text("".join(s.to_json() + "\n" for s in validation))
        trainable = [s for s in states if s.decision.is_choice]
        if not trainable:
            raise ValueError("the warm start labelled no choice-mode state to train on")
        held_out = [s for s in validation if s.decision.is_choice]
        rows = supervised_rows(trainable, self.settings.temperature)
        metrics: dict[str, float] = {}
        version = 0
        curve: list[dict[str, float]] = []
        with timeline.phase("train"):
            for epoch in range(self.settings.epochs):
                metrics, version = await self.learner.train(rows, iteration, supervised=True)
                point = {"epoch": float(epoch + 1), "loss": metrics.get("losses/policy", math.nan)}
                if held_out:
                    fit = await self.fit(held_out)
                    point.update({f"val_{k}": v for k, v in fit.items()})
                curve.append(point)
                logger.info(
                    "warm start epoch %d: loss %.4f (value MAE %.4f)%s",
                    epoch + 1,
                    metrics.get("losses/policy", math.nan),
                    metrics.get("charts/value_mae", math.nan),
                    f", held-out states: top-1 {point['val_top1']:.2f}, cross-entropy "
                    f"{point['val_cross_entropy']:.3f}"
                    if held_out
                    else "",
                )
        best = [max(s.rewards) for s in states]
        mean = [sum(s.rewards) / len(s.rewards) for s in states]
        summary: dict[str, Any] = {
            "warmstart/states": float(len(states)),
            "warmstart/mean_reward": float(np.mean(mean)),
            "warmstart/best_reward": float(np.mean(best)),
            "warmstart/loss": metrics.get("losses/policy", math.nan),
            "warmstart/value_mae": metrics.get("charts/value_mae", math.nan),
            "warmstart/policy_version": float(version),
            "warmstart/workflow_evaluations": float(labelled_evaluations(states)),
            "warmstart/executor_calls": float(sum(s.executor_calls for s in states)),
        }
        if held_out:
            summary["warmstart/val_states"] = float(len(held_out))
            summary.update(
                {f"warmstart/{k}": v for k, v in curve[-1].items() if k.startswith("val_")}
            )
            summary["epochs"] = curve
        return summary

    async def fit(self, states: Sequence[LabelledState]) -> dict[str, float]:
        """How well the learner's policy fits labelled ``states`` (:func:`fit_of`)."""
        scored = await self.learner.compute_logprobs([s.decision for s in states])
        return fit_of(states, scored.candidates or [], self.settings.temperature)
