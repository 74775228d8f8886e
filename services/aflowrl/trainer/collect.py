"""Collecting one iteration's episodes: reset the groups, then each episode acts and steps on
its own until all are done.

For iteration i the trainer starts ``trainer.tasksPerIteration`` (B) tasks (a benchmark drawn
from ``environment.benchmarks`` by weight and a task seed: :mod:`aflowrl.trainer.tasks`), each
``trainer.groupSize`` (n) times: the n episodes of a group start identically (same benchmark,
seed and seed workflow, the AFlow seed of the benchmark's task type), which is what GiGPO's and
GRPO's group baselines need. Resets go to the replica owning the seed workflow's hash, so its
evaluation is cached once for every group. :meth:`Collector.play` runs given episodes the same
way (the evaluation of a policy: :mod:`aflowrl.trainer.evaluate`).

**No lockstep.** Every episode moves as soon as its own step returns: act, step, act... An
episode that needs a decision hands its observation to a batcher (:class:`DecisionBatcher`),
which keeps at most one rollout call in flight (:mod:`aflowrl.trainer.acting`) and sends, as
soon as none is, one call with every observation waiting: those queued while the previous call
ran, or, when none was running, those handed over in the same turn of the event loop (after the
resets, every episode's first one). No fixed waiting window: a batch is whatever is ready.
Steps go in parallel across the environment replicas (:mod:`aflowrl.trainer.routing`). So no
episode waits for the slowest step of a round, and generation overlaps the other episodes'
steps; the iteration's ``generate`` and ``step`` times are each the wall time during which at
least one such call was in flight (:mod:`aflowrl.trainer.clock`).

**Determinism.** Which episodes share a rollout call, and in what order steps return, depends on
timing, so nothing may depend on it. Every decision draws on its own randomness, named by
``(trainer.seed, iteration, episode, step)`` (:class:`aflowrl.trainer.acting.Draw`: the choice
sampler's generator and the generation seed); the rollout scores each item on its own and seeds
each generated prompt on its own. With ``fused`` selection every Reset and Step carries V(s):
the table as it was when the collection started plus what that episode itself observed since
(:class:`aflowrl.trainer.values.EpisodeValues`), and the episodes' observations join the table
when the collection ends, in step order, then episode order. An iteration therefore collects
the same episodes whether or not the run was interrupted before it, and however its steps
interleaved. Used by :mod:`aflowrl.trainer.loop`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any

from aflowrl._proto.v1 import environment_pb2
from aflowrl.benchmarks import get_benchmark
from aflowrl.config import RunSpec
from aflowrl.config.learner import GiGPOSpec
from aflowrl.errors import FailedPreconditionError
from aflowrl.search import encoding
from aflowrl.trainer import noise
from aflowrl.trainer.acting import Actor, Draw
from aflowrl.trainer.clients import EnvironmentClient
from aflowrl.trainer.clock import Timeline
from aflowrl.trainer.rows import Batch, Decision, Episode, Observed, StepRow
from aflowrl.trainer.tasks import Task, training_tasks
from aflowrl.trainer.values import EpisodeValues, ValueTable
from aflowrl.workflow import Graph, library

logger = logging.getLogger(__name__)

PROBLEM_POOLS = {
    "all": environment_pb2.PROBLEM_POOL_UNSPECIFIED,
    "training": environment_pb2.PROBLEM_POOL_TRAINING,
    "tuning": environment_pb2.PROBLEM_POOL_TUNING,
    "held_out": environment_pb2.PROBLEM_POOL_HELD_OUT,
    "test": environment_pb2.PROBLEM_POOL_TEST,
}
"""A task's pool -> ResetRequest.problem_pool."""

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
            pool=task.pool,
        )
        for group, task in enumerate(tasks)
        for member in range(group_size)
    ]


def decision_draw(seed: int, iteration: int, traj: int, step: int) -> Draw:
    """The randomness of episode ``traj``'s decision at ``step`` of ``iteration``."""
    return Draw.of(seed, iteration, traj, step)


async def gather_or_cancel(coroutines: Iterable[Coroutine[Any, Any, Any]]) -> list[Any]:
    """Run the coroutines concurrently; the first to fail cancels the others (awaited) and its
    error is raised as it is."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class DecisionBatcher:
    """One actor call at a time, for every decision waiting (module docstring)."""

    def __init__(self, actor: Actor, timeline: Timeline) -> None:
        self.actor = actor
        self.timeline = timeline
        self.batches: list[int] = []
        """The size of each actor call made so far."""
        self._waiting: list[tuple[Observed, Draw, asyncio.Future[Decision]]] = []
        self._runner: asyncio.Task[None] | None = None

    async def decide(self, observed: Observed, draw: Draw) -> Decision:
        """The actor's decision on ``observed``, drawing on ``draw``."""
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self._waiting.append((observed, draw, future))
        if self._runner is None:
            self._runner = asyncio.create_task(self._run())
        return await future

    async def _run(self) -> None:
        batch: list[tuple[Observed, Draw, asyncio.Future[Decision]]] = []
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                self.batches.append(len(batch))
                try:
                    with self.timeline.phase("generate"):
                        async with self.timeline.call():
                            decisions = await self.actor.act(
                                [o for o, _, _ in batch], draws=[d for _, d, _ in batch]
                            )
                    if len(decisions) != len(batch):
                        raise RuntimeError(
                            f"the actor made {len(decisions)} decisions for {len(batch)} "
                            "observations"
                        )
                except Exception as exc:  # noqa: BLE001  # each waiting episode raises it
                    for _, _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, _, future), decision in zip(batch, decisions, strict=True):
                    if not future.done():
                        future.set_result(decision)
        finally:
            self._runner = None
            waiting, self._waiting = self._waiting, []
            for _, _, future in batch + waiting:
                future.cancel()  # a no-op on those already answered

    async def close(self) -> None:
        """Stop a call still running (its waiting episodes were cancelled)."""
        runner = self._runner
        if runner is not None:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)


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
        algorithm = spec.learner.algorithm
        self.siblings = isinstance(algorithm, GiGPOSpec) and algorithm.sibling_step_groups
        """Step every other listed action of each visited state too (GiGPO's sibling step
        groups, :meth:`_siblings`)."""

    def episodes(self, iteration: int) -> list[Episode]:
        """The episodes of ``iteration``: B groups of n, each group on one task."""
        tasks = training_tasks(self.spec, iteration)
        return group_episodes(tasks, self.spec.trainer.group_size, f"it{iteration}")

    async def reset_all(
        self,
        episodes: Sequence[Episode],
        timeline: Timeline,
        values: Sequence[EpisodeValues | None] | None = None,
    ) -> None:
        """Reset every episode (after refreshing the environment replicas); ``values``: each
        episode's V(s) to send (default: the table as it is)."""
        # New replicas (an autoscaled Service) join, recovered ones come back.
        await self.env.refresh()
        sent = values if values is not None else [None] * len(episodes)
        await asyncio.gather(
            *(self._reset(e, timeline, v) for e, v in zip(episodes, sent, strict=True))
        )

    def state_values(self) -> environment_pb2.StateValues | None:
        """V(s) to send with a Reset or Step (fused selection), else None: the table as it is
        now (the warm start's; a collection sends :class:`EpisodeValues`)."""
        return self.values.proto() if self.values is not None else None

    async def collect(self, iteration: int, timeline: Timeline) -> Batch:
        """Reset, then act and step until every episode of ``iteration`` is done."""
        return await self.play(self.episodes(iteration), iteration, timeline)

    async def play(self, episodes: list[Episode], iteration: int, timeline: Timeline) -> Batch:
        """Reset ``episodes``, then run each until it is done (module docstring)."""
        base = self.values.snapshot() if self.values is not None else None
        values = [EpisodeValues(base) if base is not None else None for _ in episodes]
        self._on_phase(iteration, "reset")
        with timeline.phase("reset"):
            await self.reset_all(episodes, timeline, values)
        batcher = DecisionBatcher(self.actor, timeline)
        reached = [0]

        def progress(step: int) -> None:
            if step + 1 > reached[0]:
                reached[0] = step + 1
                max_steps = self.spec.environment.search.max_steps
                self._on_phase(iteration, f"step {step + 1}/{max_steps}")

        # The siblings' Steps run beside the episodes (they move no episode) and are awaited
        # before the batch is returned.
        siblings: list[asyncio.Task[None]] = []
        try:
            await gather_or_cancel(
                self._play_episode(
                    e,
                    values=v,
                    iteration=iteration,
                    batcher=batcher,
                    timeline=timeline,
                    progress=progress,
                    siblings=siblings,
                )
                for e, v in zip(episodes, values, strict=True)
            )
            await asyncio.gather(*siblings)
        finally:
            await batcher.close()
            for task in siblings:
                task.cancel()
            await asyncio.gather(*siblings, return_exceptions=True)
        if self.values is not None:
            rows = sorted((r for e in episodes for r in e.rows), key=lambda r: (r.step, r.traj))
            for row in rows:
                self.values.observe(row.anchor, row.decision.value)
        return Batch(iteration, episodes)

    async def _play_episode(
        self,
        episode: Episode,
        *,
        values: EpisodeValues | None,
        iteration: int,
        batcher: DecisionBatcher,
        timeline: Timeline,
        progress: Callable[[int], None],
        siblings: list[asyncio.Task[None]],
    ) -> None:
        """Act and step ``episode`` until it is done (with sibling step groups, each step's
        siblings are started as tasks added to ``siblings``)."""
        max_steps = self.spec.environment.search.max_steps
        step = 0
        while not episode.done:
            if step >= max_steps:
                raise FailedPreconditionError(
                    f"the environment did not end episode {episode.episode_id} after "
                    f"environment.search.maxSteps={max_steps} steps"
                )
            progress(step)
            draw = decision_draw(self.spec.trainer.seed, iteration, episode.traj, step)
            decision = await batcher.decide(episode.observed(), draw)
            if values is not None:
                values.observe(episode.anchor, decision.value)
            state, admissible = episode.state, episode.admissible
            await self._step(episode, decision, step, timeline, values)
            if self.siblings and decision.is_choice and len(admissible) > 1:
                row = episode.rows[-1]
                sent = values.proto() if values is not None else None
                siblings.append(
                    asyncio.create_task(
                        self._siblings(
                            row,
                            state=state,
                            admissible=admissible,
                            episode_key=episode.episode_id,
                            timeline=timeline,
                            values=sent,
                        )
                    )
                )
            step += 1

    async def _reset(
        self, episode: Episode, timeline: Timeline, values: EpisodeValues | None = None
    ) -> None:
        search = self.spec.environment.search
        request = environment_pb2.ResetRequest(
            task=episode.benchmark,
            seed=episode.seed,
            episode_id=episode.episode_id,
            max_steps=search.max_steps,
            action_mode=_ACTION_MODES[search.action_mode],
            seed_workflow_json=self._seed_json[episode.benchmark],
            values=values.proto() if values is not None else self.state_values(),
            problem_pool=PROBLEM_POOLS[episode.pool],
        )
        seed_hash = self.seed_workflows[episode.benchmark].content_hash
        async with timeline.call():
            reply = await self.env.reset(request, key=seed_hash)
        episode.state = reply.state
        episode.seed_score = reply.seed_score
        episode.workflows = {seed_hash: request.seed_workflow_json}
        _observe(episode, reply.observation)

    async def _step(
        self,
        episode: Episode,
        decision: Decision,
        step: int,
        tl: Timeline,
        values: EpisodeValues | None,
    ) -> None:
        with tl.phase("step"):
            async with tl.call():
                reply, replica = await self.env.step(
                    episode.state,
                    decision.action,
                    episode_key=episode.episode_id,
                    values=values.proto() if values is not None else None,
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
                reward_pairs=noise.pairs([reply]),
            )
        )
        self.advance(episode, reply)

    async def step_each(
        self,
        state: bytes,
        actions: Sequence[str],
        *,
        episode_key: str,
        values: environment_pb2.StateValues | None,
        skip: int = -1,
    ) -> list[environment_pb2.StepResponse | None]:
        """Step every action of ``actions`` from the same ``state`` (the environment keeps no
        state, so each answers what taking that action would have); ``skip``: an index not to
        step (None in its place)."""

        async def one(k: int) -> environment_pb2.StepResponse | None:
            if k == skip:
                return None
            reply, _ = await self.env.step(
                state, encoding.action_reply(actions[k]), episode_key=episode_key, values=values
            )
            return reply

        return list(await asyncio.gather(*(one(k) for k in range(len(actions)))))

    async def _siblings(
        self,
        row: StepRow,
        *,
        state: bytes,
        admissible: Sequence[str],
        episode_key: str,
        timeline: Timeline,
        values: environment_pb2.StateValues | None,
    ) -> None:
        """GiGPO's sibling step group of ``row``: the reward of every listed action from the
        state it was taken in (the chosen one's is the row's own)."""
        with timeline.phase("step"):
            async with timeline.call():
                replies = await self.step_each(
                    state,
                    admissible,
                    episode_key=episode_key,
                    values=values,
                    skip=row.decision.chosen,
                )
        row.candidate_rewards = tuple(
            row.reward if reply is None else float(reply.reward) for reply in replies
        )
        row.candidate_children = tuple(
            row.child_hash if reply is None else reply.info.child_hash for reply in replies
        )
        row.candidate_duplicates = tuple(
            row.duplicate if reply is None else bool(reply.info.duplicate) for reply in replies
        )
        row.sibling_executor_calls = sum(
            int(reply.info.executor_calls) for reply in replies if reply is not None
        )
        row.reward_pairs = (*row.reward_pairs, *noise.pairs(replies))

    @staticmethod
    def advance(episode: Episode, reply: environment_pb2.StepResponse) -> None:
        """Move ``episode`` to the state a Step answered."""
        episode.state = reply.state
        episode.done = reply.done
        info = reply.info
        if info.valid_action and info.child_hash and info.child_workflow_json:
            episode.workflows.setdefault(info.child_hash, info.child_workflow_json)
        if not reply.done:
            _observe(episode, reply.observation)


def _observe(episode: Episode, observation: environment_pb2.Observation) -> None:
    episode.observation_text = observation.text
    episode.admissible = tuple(observation.admissible_actions)
    episode.anchor = observation.anchor
    episode.in_tree = tuple(observation.admissible_in_tree)


def workflow_evaluations(episodes: Sequence[Episode]) -> int:
    """Distinct (task, workflow) evaluations the episodes' steps needed: every valid step into
    a workflow its tree did not hold, and every sibling that did, counted once per task (the
    environment caches the rest). A budget unit that does not depend on what an earlier run
    left in the cache."""
    seen: set[tuple[str, int, str, str]] = set()
    for episode in episodes:
        task = (episode.benchmark, episode.seed, episode.pool)
        for row in episode.rows:
            if row.valid and not row.duplicate and row.child_hash:
                seen.add((*task, row.child_hash))
            for child, duplicate in zip(
                row.candidate_children, row.candidate_duplicates, strict=False
            ):
                if child and not duplicate:
                    seen.add((*task, child))
    return len(seen)


def batch_summary(batch: Batch) -> dict[str, float]:
    """``charts/`` and ``env/`` scalars of a collected batch."""
    from aflowrl.trainer.rows import mean, std

    rows = batch.rows
    returns = [e.episode_return for e in batch.episodes]
    calls = sum(r.executor_calls for r in rows)
    sibling_calls = sum(r.sibling_executor_calls for r in rows)
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
        "env/sibling_executor_calls": float(sibling_calls),
        "env/workflow_evaluations": float(workflow_evaluations(batch.episodes)),
        "env/cache_hits": float(hits),
        "env/cost_usd": sum(r.cost_usd for r in rows),
        "env/cost_known": 1.0 if all(r.cost_known for r in rows) else 0.0,
        **noise.reward_noise([pair for r in rows for pair in r.reward_pairs]),
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
