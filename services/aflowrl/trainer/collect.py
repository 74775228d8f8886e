"""Collecting one iteration's episodes: reset the groups, then act and step until all are done.

For iteration i the trainer starts ``trainer.tasksPerIteration`` (B) tasks (a benchmark drawn
from ``environment.benchmarks`` by weight and a task seed: :mod:`aflowrl.trainer.tasks`), each
``trainer.groupSize`` (n) times: the n episodes of a group start identically (same benchmark,
seed and seed workflow, the AFlow seed of the benchmark's task type), which is what GiGPO's and
GRPO's group baselines need. Then, while any episode is active: one rollout call decides for
every active episode (:mod:`aflowrl.trainer.acting`), and all of them step in parallel across
the environment replicas (:mod:`aflowrl.trainer.routing`). Resets go to the replica owning the
seed workflow's hash, so its evaluation is cached once for every group. :meth:`Collector.play`
runs given episodes the same way (the evaluation of a policy: :mod:`aflowrl.trainer.evaluate`).

Randomness is derived from ``(trainer.seed, iteration)`` only (tasks, the choice sampler,
generation seeds), so an iteration collects the same episodes whether or not the run was
interrupted before it. With ``fused`` selection every Reset and Step carries the trainer's V(s)
(:mod:`aflowrl.trainer.values`). Used by :mod:`aflowrl.trainer.loop`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from aflowrl._proto.v1 import environment_pb2
from aflowrl.benchmarks import get_benchmark
from aflowrl.config import RunSpec
from aflowrl.errors import FailedPreconditionError
from aflowrl.seeding import derive_seed
from aflowrl.trainer.acting import Actor, Observed
from aflowrl.trainer.clients import EnvironmentClient
from aflowrl.trainer.clock import Timeline
from aflowrl.trainer.rows import Batch, Decision, Episode, StepRow
from aflowrl.trainer.tasks import Task, training_tasks
from aflowrl.trainer.values import ValueTable
from aflowrl.workflow import Graph, library

logger = logging.getLogger(__name__)

_ACTION_MODES = {
    "choice": environment_pb2.ACTION_MODE_CHOICE,
    "text": environment_pb2.ACTION_MODE_TEXT,
    "freeform": environment_pb2.ACTION_MODE_FREEFORM,
}


def seed_workflows(benchmarks: Sequence[str]) -> dict[str, Graph]:
    """The AFlow seed workflow of each benchmark's task type (what its episodes start from)."""
    return {name: library.load("seed", get_benchmark(name).task_type) for name in benchmarks}


def group_episodes(tasks: Sequence[Task], group_size: int, prefix: str) -> list[Episode]:
    """``group_size`` episodes of each task, group by group (ids ``<prefix>-g<g>-e<m>``)."""
    return [
        Episode(
            traj=group * group_size + member,
            group=group,
            seed=task.seed,
            episode_id=f"{prefix}-g{group}-e{member}",
            benchmark=task.benchmark,
        )
        for group, task in enumerate(tasks)
        for member in range(group_size)
    ]


def iteration_rng(seed: int, iteration: int) -> np.random.Generator:
    """The generator of an iteration's choices (PCG64 seeded by the run seed and iteration)."""
    return np.random.default_rng([seed, iteration])


class Collector:
    """Runs the episodes of an iteration (module docstring)."""

    def __init__(
        self,
        spec: RunSpec,
        env: EnvironmentClient,
        actor: Actor,
        seed_workflows: Mapping[str, Graph],
        *,
        on_phase: Callable[[int, str], None] | None = None,
        values: ValueTable | None = None,
    ) -> None:
        self.spec = spec
        self.values = values
        self.env = env
        self.actor = actor
        self.seed_workflows = dict(seed_workflows)
        self._seed_json = {name: g.to_json(indent=None) for name, g in seed_workflows.items()}
        self._on_phase = on_phase or (lambda _i, _t: None)

    def episodes(self, iteration: int) -> list[Episode]:
        """The episodes of ``iteration``: B groups of n, each group on one task."""
        tasks = training_tasks(self.spec, iteration)
        return group_episodes(tasks, self.spec.trainer.group_size, f"it{iteration}")

    async def reset_all(self, episodes: Sequence[Episode], timeline: Timeline) -> None:
        """Reset every episode (after refreshing the environment replicas)."""
        # New replicas (an autoscaled Service) join, recovered ones come back.
        await self.env.refresh()
        await asyncio.gather(*(self._reset(e, timeline) for e in episodes))

    def state_values(self) -> environment_pb2.StateValues | None:
        """V(s) to send with a Reset or Step (fused selection), else None."""
        return self.values.proto() if self.values is not None else None

    async def collect(self, iteration: int, timeline: Timeline) -> Batch:
        """Reset, then act and step until every episode of ``iteration`` is done."""
        return await self.play(self.episodes(iteration), iteration, timeline)

    async def play(self, episodes: list[Episode], iteration: int, timeline: Timeline) -> Batch:
        """Reset ``episodes``, then act and step until every one is done."""
        self._on_phase(iteration, "reset")
        with timeline.phase("reset"):
            await self.reset_all(episodes, timeline)
        rng = iteration_rng(self.spec.trainer.seed, iteration)
        max_steps = self.spec.environment.search.max_steps
        step = 0
        while active := [e for e in episodes if not e.done]:
            if step >= max_steps:
                raise FailedPreconditionError(
                    f"the environment did not end {len(active)} episodes after "
                    f"environment.search.maxSteps={max_steps} steps"
                )
            self._on_phase(iteration, f"step {step + 1}/{max_steps}")
            observed = [Observed(e.observation_text, e.admissible) for e in active]
            with timeline.phase("generate"):
                async with timeline.call():
                    decisions = await self.actor.act(
                        observed,
                        rng=rng,
                        seed=derive_seed(self.spec.trainer.seed, "generate", iteration, step),
                    )
            if self.values is not None:
                for episode, decision in zip(active, decisions, strict=True):
                    self.values.observe(episode.anchor, decision.value)
            with timeline.phase("step"):
                await asyncio.gather(
                    *(
                        self._step(e, d, step, timeline)
                        for e, d in zip(active, decisions, strict=True)
                    )
                )
            step += 1
        return Batch(iteration, episodes)

    async def _reset(self, episode: Episode, timeline: Timeline) -> None:
        search = self.spec.environment.search
        request = environment_pb2.ResetRequest(
            task=episode.benchmark,
            seed=episode.seed,
            episode_id=episode.episode_id,
            max_steps=search.max_steps,
            action_mode=_ACTION_MODES[search.action_mode],
            seed_workflow_json=self._seed_json[episode.benchmark],
            values=self.state_values(),
        )
        seed_hash = self.seed_workflows[episode.benchmark].content_hash
        async with timeline.call():
            reply = await self.env.reset(request, key=seed_hash)
        episode.state = reply.state
        episode.seed_score = reply.seed_score
        _observe(episode, reply.observation)

    async def _step(self, episode: Episode, decision: Decision, step: int, tl: Timeline) -> None:
        async with tl.call():
            reply, replica = await self.env.step(
                episode.state,
                decision.action,
                episode_key=episode.episode_id,
                values=self.state_values(),
            )
        info = reply.info
        episode.rows.append(
            StepRow(
                traj=episode.traj,
                group=episode.group,
                step=step,
                anchor=episode.anchor,
                decision=decision,
                reward=reply.reward,
                valid=info.valid_action,
                done=reply.done,
                child_hash=info.child_hash,
                child_score=info.child_score,
                parent_score=info.parent_score,
                best_score=info.best_score,
                canonical_action=info.canonical_action,
                child_workflow_json=info.child_workflow_json,
                duplicate=info.duplicate,
                best_gain=info.best_gain,
                executor_calls=info.executor_calls,
                cache_hits=info.cache_hits,
                cost_usd=info.cost_usd,
                cost_known=info.cost_known,
                replica=replica,
            )
        )
        self.advance(episode, reply)

    @staticmethod
    def advance(episode: Episode, reply: environment_pb2.StepResponse) -> None:
        """Move ``episode`` to the state a Step answered."""
        episode.state = reply.state
        episode.done = reply.done
        if not reply.done:
            _observe(episode, reply.observation)


def _observe(episode: Episode, observation: environment_pb2.Observation) -> None:
    episode.observation_text = observation.text
    episode.admissible = tuple(observation.admissible_actions)
    episode.anchor = observation.anchor


def batch_summary(batch: Batch) -> dict[str, float]:
    """``charts/`` and ``env/`` scalars of a collected batch."""
    from aflowrl.trainer.rows import mean, std

    rows = batch.rows
    returns = [e.episode_return for e in batch.episodes]
    calls = sum(r.executor_calls for r in rows)
    hits = sum(r.cache_hits for r in rows)
    return {
        "charts/episode_return": mean(returns),
        "charts/episode_return_std": std(returns),
        "charts/best_gain": mean([e.best_gain for e in batch.episodes]),
        "charts/step_reward": mean([r.reward for r in rows]),
        "charts/iteration_best_score": max(e.best_score for e in batch.episodes),
        "charts/seed_score": mean([e.seed_score for e in batch.episodes]),
        "charts/valid_action_ratio": mean([1.0 if r.valid else 0.0 for r in rows]),
        "charts/duplicate_ratio": mean([1.0 if r.duplicate else 0.0 for r in rows]),
        "charts/episodes": float(len(batch.episodes)),
        "charts/steps": float(len(rows)),
        "rollout/version_min": float(min((r.decision.version for r in rows), default=0)),
        "rollout/version_max": float(max((r.decision.version for r in rows), default=0)),
        "env/executor_calls": float(calls),
        "env/cache_hits": float(hits),
        "env/cost_usd": sum(r.cost_usd for r in rows),
        "env/cost_known": 1.0 if all(r.cost_known for r in rows) else 0.0,
    }


BENCHMARK_CHARTS = (
    "charts/episode_return",
    "charts/iteration_best_score",
    "charts/seed_score",
    "charts/valid_action_ratio",
    "charts/duplicate_ratio",
    "charts/episodes",
)
"""Scalars of :func:`batch_summary` also recorded per benchmark in a multi-benchmark run."""


def benchmark_summary(batch: Batch) -> dict[str, float]:
    """``<chart>/<benchmark>`` for each of :data:`BENCHMARK_CHARTS` and each benchmark the
    batch played (benchmarks no group drew this iteration have no key)."""
    played: dict[str, list[Episode]] = {}
    for episode in batch.episodes:
        played.setdefault(episode.benchmark, []).append(episode)
    out: dict[str, float] = {}
    for name, episodes in played.items():
        summary = batch_summary(Batch(batch.iteration, episodes))
        out.update({f"{key}/{name}": summary[key] for key in BENCHMARK_CHARTS})
    return out


def replicas_used(rows: Sequence[StepRow]) -> dict[str, int]:
    """Steps served per environment replica."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.replica] = counts.get(row.replica, 0) + 1
    return counts
