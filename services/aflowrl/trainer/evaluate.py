"""A policy played on chosen tasks without training: held-out tasks, held-out benchmarks.

:func:`evaluate_policy` runs ``episodes_per_task`` episodes of an actor (the trainer's
:class:`~aflowrl.trainer.acting.ChoiceActor` / :class:`~aflowrl.trainer.acting.TextActor` on
the rollout's current weights, or :class:`~aflowrl.trainer.acting.UniformActor`) on each given
task (a benchmark and a task seed: :class:`~aflowrl.trainer.tasks.Task`), through the same
collection path as training (:meth:`aflowrl.trainer.collect.Collector.play`: reset, then each
episode acts and steps on its own until done), and returns one :class:`EpisodeResult` per
episode. Nothing is trained, no weights move, and nothing is written. Sampling is seeded by
``seed``, so the same call on the same weights gives the same episodes.

Held-out tasks come from :func:`aflowrl.trainer.tasks.run_held_out_tasks` (task seeds training
never draws, problems of the held-out pool or of the test split); a benchmark of
``environment.heldOutBenchmarks`` is served by the environment but never trained on, so playing
it measures transfer. :func:`summarize` and :func:`policy_table`
aggregate the results per benchmark (mean ± standard error over episodes).

:func:`proposer_comparison` plays the trained policy (searching with its own values under
``fused`` selection) and the random proposer (UCB alone) on the same held-out tasks, episodes
and seeds, so both spend the same evaluation budget; :func:`comparison_table` shows the policy's
lead in best-gain (the best score among new workflows minus the seed's) with its standard error.

Used by :mod:`aflowrl.trainer.loop` (every run ends with the comparison, and with the per-
benchmark table when it has held-out benchmarks) and ``bench/learning.py`` (each method's final
policy on the same held-out tasks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from aflowrl.config import RunSpec
from aflowrl.errors import InvalidInputError
from aflowrl.trainer.acting import Actor, ChoiceActor, TextActor, UniformActor, ValueReader
from aflowrl.trainer.clients import EnvironmentClient, RolloutClient
from aflowrl.trainer.clock import Timeline
from aflowrl.trainer.collect import Collector, group_episodes, seed_workflows
from aflowrl.trainer.final import aligned_table
from aflowrl.trainer.rows import Episode, mean
from aflowrl.trainer.tasks import Task, run_held_out_tasks
from aflowrl.trainer.values import ValueTable

MAX_EPISODES = 100_000
"""Most episodes of one evaluation."""


@dataclass(frozen=True)
class EpisodeResult:
    """One evaluation episode."""

    benchmark: str
    seed: int
    """The task seed."""
    episode_id: str
    episode_return: float
    """Undiscounted sum of the environment's rewards (no invalid-action penalty)."""
    seed_score: float
    """Validation score of the seed workflow on the episode's problems."""
    best_score: float
    """Best validation score in the episode's tree."""
    best_gain: float
    """Best score among the workflows the episode added minus the seed's (0: none added)."""
    steps: int
    duplicates: int
    """Valid steps that reached a workflow the tree already held."""
    invalid_steps: int
    best_workflow_json: str | None = None
    """The best-scoring workflow the episode added (JSON; None when it added none)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> EpisodeResult:
        """The inverse of :meth:`to_dict`."""
        return EpisodeResult(**data)

    @staticmethod
    def of(episode: Episode) -> EpisodeResult:
        return EpisodeResult(
            benchmark=episode.benchmark,
            seed=episode.seed,
            episode_id=episode.episode_id,
            episode_return=episode.episode_return,
            seed_score=episode.seed_score,
            best_score=episode.best_score,
            best_gain=episode.best_gain,
            steps=len(episode.rows),
            duplicates=sum(1 for r in episode.rows if r.valid and r.duplicate),
            invalid_steps=sum(1 for r in episode.rows if not r.valid),
            best_workflow_json=_best_new(episode),
        )


def _best_new(episode: Episode) -> str | None:
    added = [r for r in episode.rows if r.valid and not r.duplicate and r.child_workflow_json]
    if not added:
        return None
    return max(added, key=lambda r: r.child_score).child_workflow_json


def policy_actor(spec: RunSpec, rollout: RolloutClient) -> Actor:
    """The policy served by ``rollout``, acting in the run's action mode and reading its value
    when ``policy.value`` is on (what the trainer trains with, and what an evaluation of a
    trained policy plays)."""
    values = ValueReader.of(spec)
    if spec.environment.search.action_mode == "choice":
        return ChoiceActor(rollout, values)
    return TextActor(rollout, spec, values)


def value_table(spec: RunSpec) -> ValueTable | None:
    """A fresh V(s) table for ``fused`` selection (None for the other rules)."""
    search = spec.environment.search
    if search.selection == "fused" and search.value_source != "none":
        return ValueTable(search.value_source)
    return None


async def evaluate_policy(
    spec: RunSpec,
    env: EnvironmentClient,
    actor: Actor,
    tasks: Sequence[Task],
    *,
    episodes_per_task: int = 1,
    seed: int = 0,
    values: ValueTable | None = None,
    timeline: Timeline | None = None,
) -> list[EpisodeResult]:
    """Play ``episodes_per_task`` episodes of ``actor`` on each task; nothing is trained
    (:func:`play_episodes`, each episode summarised)."""
    episodes = await play_episodes(
        spec,
        env,
        actor,
        tasks,
        episodes_per_task=episodes_per_task,
        seed=seed,
        values=values,
        timeline=timeline,
    )
    return [EpisodeResult.of(episode) for episode in episodes]


async def play_episodes(
    spec: RunSpec,
    env: EnvironmentClient,
    actor: Actor,
    tasks: Sequence[Task],
    *,
    episodes_per_task: int = 1,
    seed: int = 0,
    values: ValueTable | None = None,
    timeline: Timeline | None = None,
) -> list[Episode]:
    """Play ``episodes_per_task`` episodes of ``actor`` on each task; nothing is trained; the
    episodes whole, their step rows included (the policy's V(s) of each step among them).

    ``spec`` gives the search settings (episode length, action mode) and the benchmarks the
    environment serves; a task on another benchmark is refused before anything starts.
    ``values`` is the V(s) table of ``fused`` selection (default: a fresh one, which the
    policy's own values fill as it plays). Results are in task order,
    the episodes of a task together.
    """
    if not tasks:
        return []
    if episodes_per_task < 1:
        raise InvalidInputError(f"{episodes_per_task} is below 1", field="episodes_per_task")
    if len(tasks) * episodes_per_task > MAX_EPISODES:
        raise InvalidInputError(
            f"{len(tasks)} tasks x {episodes_per_task} episodes is over {MAX_EPISODES}",
            field="tasks",
        )
    served = spec.environment.served_benchmarks
    for index, task in enumerate(tasks):
        if task.benchmark not in served:
            raise InvalidInputError(
                f"{task.benchmark!r} is not served by this run (environment.benchmarks and "
                f"heldOutBenchmarks: {', '.join(served)})",
                field=f"tasks[{index}].benchmark",
            )
        if task.seed < 0:
            raise InvalidInputError(f"{task.seed} is negative", field=f"tasks[{index}].seed")
    # The collector seeds each decision from trainer.seed, the iteration, episode and step.
    seeded = spec.model_copy(update={"trainer": spec.trainer.model_copy(update={"seed": seed})})
    benchmarks = list(dict.fromkeys(task.benchmark for task in tasks))
    if values is None:
        values = value_table(spec)
    collector = Collector(seeded, env, actor, seed_workflows(benchmarks), values=values)
    episodes = group_episodes(tasks, episodes_per_task, f"eval{seed}")
    batch = await collector.play(episodes, 0, timeline or Timeline())
    return list(batch.episodes)


async def held_out_evaluation(
    spec: RunSpec,
    env: EnvironmentClient,
    actor: Actor,
    *,
    values: ValueTable | None = None,
) -> list[EpisodeResult]:
    """The policy on held-out tasks of every benchmark the run serves (training and held-out):
    ``trainer.tasksPerIteration`` x ``trainer.groupSize`` tasks each (problems from the held-out
    pool, or from the test split: :func:`~aflowrl.trainer.tasks.run_held_out_tasks`), one
    episode per task, seeded by ``trainer.seed`` (what every run ends with; one
    episode per task keeps the episodes independent, so standard errors over them are honest)."""
    trainer = spec.trainer
    tasks = run_held_out_tasks(spec, trainer.tasks_per_iteration * trainer.group_size)
    return await evaluate_policy(
        spec, env, actor, tasks, episodes_per_task=1, seed=trainer.seed, values=values
    )


@dataclass(frozen=True)
class BenchmarkSummary:
    """Evaluation episodes of one benchmark, aggregated (means over episodes)."""

    benchmark: str
    held_out: bool
    """Whether the benchmark is held out (never trained on): a transfer measurement."""
    episodes: int
    episode_return: float
    episode_return_se: float
    """Standard error of the mean return (NaN with one episode)."""
    seed_score: float
    best_score: float
    duplicate_ratio: float
    """Duplicate steps per step."""
    invalid_ratio: float
    """Invalid steps per step."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _standard_error(values: Sequence[float]) -> float:
    if len(values) < 2:
        return math.nan
    m = mean(values)
    variance = math.fsum((v - m) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(variance / len(values))


def summarize(
    results: Sequence[EpisodeResult], *, held_out: Sequence[str] = ()
) -> list[BenchmarkSummary]:
    """Per benchmark, in the order the results first name them."""
    by: dict[str, list[EpisodeResult]] = {}
    for result in results:
        by.setdefault(result.benchmark, []).append(result)
    out = []
    for name, group in by.items():
        returns = [r.episode_return for r in group]
        steps = sum(r.steps for r in group)
        out.append(
            BenchmarkSummary(
                benchmark=name,
                held_out=name in held_out,
                episodes=len(group),
                episode_return=mean(returns),
                episode_return_se=_standard_error(returns),
                seed_score=mean([r.seed_score for r in group]),
                best_score=mean([r.best_score for r in group]),
                duplicate_ratio=sum(r.duplicates for r in group) / steps if steps else math.nan,
                invalid_ratio=sum(r.invalid_steps for r in group) / steps if steps else math.nan,
            )
        )
    return out


def policy_table(summaries: Sequence[BenchmarkSummary], *, title: str) -> str:
    """The summaries as an aligned text table."""
    header = (
        "benchmark",
        "episodes",
        "return",
        "seed score",
        "best score",
        "duplicates",
        "invalid",
    )

    def number(value: float, spec: str) -> str:
        return "-" if math.isnan(value) else format(value, spec)

    body = [
        (
            f"{s.benchmark} (held out)" if s.held_out else s.benchmark,
            str(s.episodes),
            f"{s.episode_return:+.4f} ± {number(s.episode_return_se, '.4f')}",
            f"{s.seed_score:.3f}",
            f"{s.best_score:.3f}",
            number(s.duplicate_ratio, ".0%"),
            number(s.invalid_ratio, ".0%"),
        )
        for s in summaries
    ]
    return aligned_table(title, header, body)


async def proposer_comparison(
    spec: RunSpec, env: EnvironmentClient, actor: Actor
) -> tuple[list[EpisodeResult], list[EpisodeResult]]:
    """(the policy's, the random proposer's) episodes on the same held-out tasks.

    The policy searches as the run does (``fused`` selection on a fresh table its own values
    fill); the random proposer picks uniformly among the listed actions and, having no values,
    searches with UCB alone (an empty table). Same tasks, episodes, steps and seeds: the same
    number of workflow evaluations.
    """
    policy = await held_out_evaluation(spec, env, actor)
    empty = ValueTable.empty() if value_table(spec) is not None else None
    random = await held_out_evaluation(spec, env, UniformActor(), values=empty)
    return policy, random


def comparison_table(
    proposers: Sequence[tuple[str, Sequence[EpisodeResult]]], *, title: str
) -> str:
    """Proposers side by side (means ± standard errors over episodes), then the first one's
    best-gain lead over each of the others, paired by episode (the same held-out task and
    seed), in standard errors of the paired differences."""
    header = ("proposer", "episodes", "steps", "best gain", "return", "duplicates")

    def row(name: str, results: Sequence[EpisodeResult]) -> tuple[str, ...]:
        gains = [r.best_gain for r in results]
        returns = [r.episode_return for r in results]
        steps = sum(r.steps for r in results)
        dups = sum(r.duplicates for r in results)
        return (
            name,
            str(len(results)),
            str(steps),
            f"{mean(gains):+.4f} ± {_se_text(gains)}",
            f"{mean(returns):+.4f} ± {_se_text(returns)}",
            f"{dups / steps:.0%}" if steps else "-",
        )

    table = aligned_table(title, header, [row(name, results) for name, results in proposers])
    (first, policy), *others = proposers
    lines = [table]
    for name, results in others:
        if len(results) != len(policy) or not policy:
            continue
        lead, size = _paired_lead(policy, results)
        lines.append(f"best-gain lead of the {first} over the {name}: {lead:+.4f} ({size or '-'})")
    return "\n".join(lines)


def _paired_lead(
    trained: Sequence[EpisodeResult], other: Sequence[EpisodeResult]
) -> tuple[float, str]:
    """The mean best-gain difference of paired episodes and its size in standard errors of
    the differences (``"+1.9 SE"``; empty when the standard error is 0 or undefined)."""
    leads = [a.best_gain - b.best_gain for a, b in zip(trained, other, strict=True)]
    lead, se = mean(leads), _standard_error(leads)
    return lead, "" if math.isnan(se) or se == 0 else f"{lead / se:+.1f} SE"


def lead_sentence(
    trained: Sequence[EpisodeResult],
    start: Sequence[EpisodeResult],
    *,
    random: Sequence[EpisodeResult] = (),
    name: str = "policy",
) -> str | None:
    """One sentence on the trained policy's best-gain lead over the policy RL started from on the
    same held-out tasks (with its size in standard errors of the paired differences); without
    a lead, the room the seed workflow left there (1 - its mean score), the most any proposer
    could gain, and how much of it the policy RL started from already gained. With the random
    proposer's episodes on the same tasks, a second sentence on the lead over it. None when the
    trained policy and the policy it started from were not played alike."""
    if not trained or len(trained) != len(start):
        return None
    lead, size = _paired_lead(trained, start)
    margin = f", {size}" if size else ""
    if lead > 0:
        sentence = (
            f"The trained {name} leads the {name} it started from by {lead:+.4f} best-gain "
            f"({len(trained)} held-out tasks{margin})."
        )
    else:
        seed_score = mean([r.seed_score for r in trained])
        room = (
            f"the seed workflow already scores {seed_score:.3f} on their problems, leaving at "
            f"most {1.0 - seed_score:.3f} to gain"
        )
        started = mean([r.best_gain for r in start])
        if started > 0:
            room += f", of which the {name} it started from already gains {started:+.4f}"
        sentence = (
            f"The trained {name} has no lead ({lead:+.4f}{margin}) over the {name} it started "
            f"from on {len(trained)} held-out tasks: {room}."
        )
    if len(random) == len(trained):
        over, size = _paired_lead(trained, random)
        if over > 0:
            sentence += f" Over the random proposer it leads by {over:+.4f}"
            sentence += f" ({size})." if size else "."
        else:
            margin = f", {size}" if size else ""
            sentence += f" It has no lead over the random proposer ({over:+.4f}{margin})."
    return sentence


def _se_text(values: Sequence[float]) -> str:
    se = _standard_error(values)
    return "-" if math.isnan(se) else f"{se:.4f}"
