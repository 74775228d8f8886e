"""The RL loop: collect episodes, compute advantages, update the policy, push weights, record.

Per iteration (``trainer.iterations`` of them)::

    (once)      a fresh run with trainer.warmStart: label behaviour episodes and train
                the policy on them, supervised                                (warmstart.py)
    collect     reset B task seeds x n episodes; each acts and steps on its own
                until done, decisions batched from whatever is waiting          (collect.py)
    advantage   gigpo (default), grpo/rloo or ppo-with-critic targets         (advantages.py)
    logprob     ComputeLogProbs: critic values (ppo), old log-probs of rows from an older
                policy version (and of every row when rollout and learner numerics differ);
                the learner scores the reference itself when learner.loss.klCoef > 0
    train       one Train call with every row                                 (learner_client.py)
    weight_sync push the new version to every rollout replica                 (weight_sync.py)
    record      metrics.jsonl, trees.jsonl, curves.png, best workflows, progress,
                status (records.py); the experiment trackers          (tracking.py)
    checkpoint  every trainer.checkpointEvery iterations and at the end       (state.py)

**Off-policy overlap** (``trainer.offPolicy.enabled``): the next iteration's episodes are
collected while the current update runs, so their actions come from a policy one version
behind. Rows more than ``maxStaleness`` versions behind the learner are dropped; the others are
trained with decoupled PPO (Hilton et al., 2022, arXiv 2110.00641): the learner's current
log-probs serve as pi_old for the clipped ratio, and the advantages are multiplied by the
truncated importance weight w_t = min(exp(log pi_old - log pi_behaviour), C).

**Resume.** A checkpoint is the learner's checkpoint plus this trainer's state as its
``client_state``. On start the trainer loads the newest checkpoint of its run directory's index,
drops later records from ``metrics.jsonl`` and goes on from the next iteration: every iteration
is recorded exactly once. Rollout replicas may have served versions newer than the checkpoint
(the learner trained on after it); the restored weights then get a version above them, since
versions only increase. A learner whose version is not the one the trainer expects (it
restarted) stops the trainer, whose restart resumes from the checkpoint.

**Several benchmarks** (``environment.benchmarks``): each group's task is drawn by weight
(:mod:`aflowrl.trainer.tasks`) and starts from the seed workflow of its benchmark's task type;
the best workflows are kept per benchmark (``best/<benchmark>/``), the records add
per-benchmark scalars, and the final comparison is one table per training benchmark. With
``environment.heldOutBenchmarks`` the end of the run adds a transfer table per held-out
benchmark and plays the final policy on held-out tasks of every served benchmark
(:mod:`aflowrl.trainer.evaluate`; ``held_out.json``).

**Every run ends** with the trained policy against the random proposer and against the policy
RL started from (played on the same tasks right after the warm start) on held-out tasks of
every served benchmark (task seeds training never drew, problems from the held-out pool): the
policies searching with their own values (``fused``), random with UCB alone, the same tasks,
episodes and evaluation budget (:func:`aflowrl.trainer.evaluate.proposer_comparison`); the
table closes ``final.md``.

Runs are reproducible on a CPU with overlap off (every random choice derives from
``trainer.seed``, the iteration, and for a decision its episode and step, so neither an
interruption nor the order in which steps return changes what an iteration collects). Called
by ``aflowrl train`` (:mod:`aflowrl.cli.train`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aflowrl.common.run_status import RunStatusReporter
from aflowrl.config import RunSpec
from aflowrl.errors import FailedPreconditionError, InvalidInputError, NotFoundError
from aflowrl.trainer import collect as collecting
from aflowrl.trainer import tracking, trees
from aflowrl.trainer.acting import Actor
from aflowrl.trainer.advantages import RowTargets, compute_advantages
from aflowrl.trainer.clients import EnvironmentClient, LearnerClient, RolloutClient, TrainRow
from aflowrl.trainer.clock import Timeline
from aflowrl.trainer.errors import LearnerDivergedError, NoReplicaError
from aflowrl.trainer.evaluate import (
    EpisodeResult,
    comparison_table,
    held_out_evaluation,
    lead_sentence,
    policy_actor,
    policy_table,
    proposer_comparison,
    summarize,
)
from aflowrl.trainer.final import (
    FinalRow,
    best_against_baselines,
    final_comparison,
    final_table,
)
from aflowrl.trainer.metrics import TrainerMetrics
from aflowrl.trainer.progress import Progress
from aflowrl.trainer.records import RunDirectory, utc_now
from aflowrl.trainer.rows import Batch, StepRow, mean
from aflowrl.trainer.state import (
    BestWorkflow,
    CheckpointEntry,
    CheckpointIndex,
    TrainerState,
    spec_fingerprint,
)
from aflowrl.trainer.values import ValueTable
from aflowrl.trainer.warmstart import WarmStart
from aflowrl.trainer.weight_sync import WeightSync

logger = logging.getLogger(__name__)

KEEP_BEST = 5
"""Distinct best workflows kept per training benchmark (and written to ``best/``)."""


@dataclass
class Services:
    """Clients of the three services (the trainer owns and closes them)."""

    env: EnvironmentClient
    rollout: RolloutClient
    learner: LearnerClient
    weights: WeightSync

    async def close(self) -> None:
        await self.env.close()
        await self.rollout.close()
        await self.learner.close()
        await self.weights.close()


@dataclass
class RunResult:
    """What a finished run leaves: its state, the final comparison and the run directory."""

    state: TrainerState
    final_rows: list[FinalRow] = field(default_factory=list)
    final_table: str = ""
    run_dir: Path | None = None
    best_dir: Path | None = None
    """``best/<rank>-<hash>`` of the workflow the final comparison chose (None without one, or
    with several training benchmarks: see ``best_dirs``)."""
    best_dirs: dict[str, Path] = field(default_factory=dict)
    """Training benchmark -> the folder of the workflow its final comparison chose."""
    held_out: list[EpisodeResult] = field(default_factory=list)
    """The trained policy's episodes on held-out tasks (the final comparison)."""
    random_held_out: list[EpisodeResult] = field(default_factory=list)
    """The random proposer's episodes on the same tasks."""
    start_held_out: list[EpisodeResult] = field(default_factory=list)
    """The episodes of the policy RL started from (after the warm start) on the same tasks."""


def recompute_all_old_logprobs(spec: RunSpec) -> bool:
    """Whether rollout and learner numerics may differ (vLLM, or 16-bit weights on GPU)."""
    gpus = spec.rollout.resources.gpus > 0 or spec.learner.resources.gpus > 0
    half = spec.policy.dtype in ("bfloat16", "float16") or (spec.policy.dtype == "auto" and gpus)
    return spec.rollout.engine == "vllm" or half


class Trainer:
    """The loop of the module docstring."""

    def __init__(
        self,
        spec: RunSpec,
        services: Services,
        run_dir: RunDirectory,
        *,
        progress: Progress | None = None,
        reporter: RunStatusReporter | None = None,
        metrics: TrainerMetrics | None = None,
        actor: Actor | None = None,
        train: bool = True,
    ) -> None:
        self.spec = spec
        self.services = services
        self.run_dir = run_dir
        self.progress = progress
        self.reporter = reporter
        self.metrics = metrics or TrainerMetrics()
        self.train_policy = train
        self.actor = actor or policy_actor(spec, services.rollout)
        self.benchmarks = spec.environment.training_benchmarks
        self.seed_workflows = collecting.seed_workflows(spec.environment.served_benchmarks)
        search = spec.environment.search
        self.values: ValueTable | None = None
        if search.selection == "fused" and search.value_source != "none":
            self.values = ValueTable(search.value_source)
        self.collector = collecting.Collector(
            spec,
            services.env,
            self.actor,
            self.seed_workflows,
            on_phase=progress.phase if progress is not None else None,
            values=self.values,
        )
        self.index = CheckpointIndex(run_dir.path)
        self.state = TrainerState(seed=spec.trainer.seed, fingerprint=spec_fingerprint(spec))
        self._started = time.monotonic()
        self._elapsed_before = 0.0
        self._pictures: asyncio.Task[None] | None = None
        """The pictures of the last iteration, drawn on a thread (:meth:`_publish`)."""
        self.start_held_out: list[EpisodeResult] = []
        """The starting policy's held-out episodes (:meth:`_starting_point`)."""
        self.trackers = tracking.Trackers()
        """The experiment trackers, open while :meth:`run` runs."""
        self._resumed_record: dict[str, Any] | None = None
        """The last recorded iteration of a resumed run, sent to the trackers again on start."""

    # ---- start ----------------------------------------------------------------------------------

    async def check_services(self) -> None:
        """Fail early, naming the problem, when a service cannot serve this run."""
        env = self.services.env
        await env.refresh()
        infos = await env.info()
        if not infos:
            raise NoReplicaError(f"no environment replica answered at {env.target}")
        held_out = self.spec.environment.held_out_benchmarks
        for info in infos:
            for benchmark in self.spec.environment.served_benchmarks:
                if benchmark not in info.tasks:
                    field = "heldOutBenchmarks" if benchmark in held_out else "benchmarks"
                    raise InvalidInputError(
                        f"{benchmark!r} is not served by environment replica "
                        f"{info.service.hostname} (it serves "
                        f"{', '.join(info.tasks) or 'nothing'})",
                        field=f"spec.environment.{field}",
                    )
        self.services.rollout.refresh()
        if self.train_policy:
            status = await self.services.learner.status()
            wants_critic = self.spec.learner.algorithm.type == "ppo"
            if status.has_critic != wants_critic:
                raise FailedPreconditionError(
                    f"the learner {'has' if status.has_critic else 'has no'} critic but "
                    f"learner.algorithm.type is {self.spec.learner.algorithm.type!r}: "
                    "the learner runs another spec"
                )

    async def start(self) -> None:
        """Resume from the newest loadable checkpoint, or start fresh."""
        if self.train_policy:
            await self._restore()
        else:
            self.run_dir.truncate_metrics(0)
        self.run_dir.write_spec(self.spec)
        if self.state.best:
            self._write_best(self._best_snapshot())

    async def _restore(self) -> None:
        learner = self.services.learner
        rollout_top = max((await self.services.rollout.versions()).values(), default=0)
        entries = self.index.entries()
        for entry in reversed(entries):
            # Replicas may serve versions trained after this checkpoint: lift the restored
            # weights above them (versions only increase), so the push below reaches them.
            bump = rollout_top + 1 if rollout_top >= entry.policy_version else 0
            try:
                loaded = await learner.load(entry.path, min_policy_version=bump)
            except NotFoundError as exc:
                logger.warning("checkpoint %s cannot be loaded: %s", entry.path, exc)
                continue
            state = TrainerState.from_bytes(loaded.client_state, source=entry.path)
            state.check_resumable(self.spec)
            state.policy_version = int(loaded.policy_version)
            self.state = state
            if self.values is not None and state.values is not None:
                self.values = ValueTable.from_dict(state.values)
                self.collector.values = self.values
            self.index.discard_after(state.iteration)
            dropped = self.run_dir.truncate_metrics(state.iteration)
            kept = self.run_dir.read_metrics()
            if state.last_record is not None and len(kept) < state.iteration:
                # Saved, then stopped before its record was written: write it now.
                self.run_dir.append_metrics(state.last_record)
                kept.append(state.last_record)
            # The trackers may not have seen it either: a stop after the checkpoint, before
            # the iteration's tracker call, would leave it out of TensorBoard for good.
            self._resumed_record = kept[-1] if kept else None
            self._elapsed_before = state.elapsed_s
            logger.info(
                "resumed from %s: %d iterations done, policy v%d (%d later records dropped)",
                entry.path,
                state.iteration,
                state.policy_version,
                dropped,
            )
            break
        else:
            if entries:
                raise NotFoundError(f"no checkpoint listed in {self.index.file} could be loaded")
            self.run_dir.truncate_metrics(0)
            version = int((await learner.status()).policy_version)
            if rollout_top > version:
                raise LearnerDivergedError(
                    f"rollout replicas serve policy v{rollout_top} but the learner is at "
                    f"v{version} and this run has no checkpoint: restart the rollout replicas"
                )
            self.state.policy_version = version
            if self.spec.trainer.warm_start.episodes > 0:
                await self._warm_start()
        await self._push(Timeline())

    async def _warm_start(self) -> None:
        """The supervised warm start of a fresh run (:mod:`aflowrl.trainer.warmstart`)."""
        if self.progress is not None:
            self.progress.write(
                f"warm start: labelling {self.spec.trainer.warm_start.episodes} episodes"
            )
        timeline = Timeline()
        warm = WarmStart(
            self.spec, self.collector, self.actor, self.services.env, self.services.learner
        )
        summary = await warm.run(self.run_dir.path, 0, timeline)
        timeline.finish()
        summary.update({f"warmstart/{k}": v for k, v in timeline.record().items()})
        self.state.policy_version = int(summary["warmstart/policy_version"])
        self.run_dir.write_warm_start(summary)
        logger.info(
            "warm start: %d states labelled, policy v%d",
            int(summary["warmstart/states"]),
            self.state.policy_version,
        )

    # ---- the loop -------------------------------------------------------------------------------

    async def run(self) -> RunResult:
        """Check the services, resume or start, train every iteration left, then evaluate."""
        tracking.check_available(self.spec.monitoring.loggers)
        await self.check_services()
        await self.start()
        self.trackers = tracking.open_trackers(self.spec, self.run_dir.path)
        with self.trackers:
            if self._resumed_record is not None:
                # Sent again whether or not they saw it: TensorBoard's new session starts at
                # this step and replaces it, W&B and MLflow start new runs on a resume.
                self.trackers.log(int(self._resumed_record["iteration"]), self._resumed_record)
            return await self._run()

    async def _run(self) -> RunResult:
        """The iterations and the final evaluation, with the experiment trackers open."""
        await self._starting_point()
        if self.progress is not None:
            self.progress.start_at(self.state.iteration)
        total = self.spec.trainer.iterations
        overlap = self.spec.trainer.off_policy.enabled and self.train_policy
        pending: asyncio.Task[Batch] | None = None
        timeline = Timeline()
        try:
            for iteration in range(self.state.iteration, total):
                if pending is None:
                    batch = await self.collector.collect(iteration, timeline)
                else:
                    batch = await pending
                    pending = None
                ahead: Timeline | None = None
                if overlap and iteration + 1 < total:
                    ahead = Timeline()
                    pending = asyncio.create_task(self.collector.collect(iteration + 1, ahead))
                following = await self._iteration(batch, timeline)
                timeline = ahead if ahead is not None else following
        finally:
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
            await self._settle_pictures()
        result = RunResult(self.state, run_dir=self.run_dir.path)
        if self.spec.trainer.final_test_eval:
            await self._finish(result)
        if self.reporter is not None:
            await self.reporter.areport(completion_time=utc_now())
        return result

    async def _starting_point(self) -> None:
        """Play the policy RL starts from (after the warm start) on the held-out tasks the run
        ends with, once per run (``start_held_out.json``; a resumed run reads it back), so the
        final table shows what RL added to it."""
        if not (self.train_policy and self.spec.trainer.final_test_eval):
            return
        stored = self.run_dir.read_start_held_out()
        if stored is not None:
            self.start_held_out = [EpisodeResult.from_dict(e) for e in stored]
            return
        if self.state.iteration > 0:
            return  # resumed from a run that did not keep its starting point
        if self.progress is not None:
            self.progress.write("playing the policy RL starts from on held-out tasks")
        self.start_held_out = await held_out_evaluation(self.spec, self.services.env, self.actor)
        self.run_dir.write_start_held_out([e.to_dict() for e in self.start_held_out])

    async def _iteration(self, batch: Batch, timeline: Timeline) -> Timeline:
        """Learn from ``batch``, record it; returns the clock of the next iteration, started
        before this one's records are published (so their time counts as the trainer's)."""
        iteration = batch.iteration
        self._note_workflows(batch)
        if self.values is not None and self.values.source == "anchor-mc":
            self.values.record(batch.rows)
        learned: dict[str, float] = {}
        if self.train_policy:
            if self.progress is not None:
                self.progress.phase(iteration, "update")
            learned = await self._learn(batch, timeline)
        self.state.iteration = iteration + 1
        self.state.episodes += len(batch.episodes)
        self.state.elapsed_s = self._elapsed_before + time.monotonic() - self._started
        self.state.values = self.values.to_dict() if self.values is not None else None
        record = self._record(batch, learned)
        if self._checkpoint_due(iteration):
            if self.progress is not None:
                self.progress.phase(iteration, "checkpoint")
            with timeline.phase("checkpoint"):
                async with timeline.call():
                    await self._checkpoint({**record, **timeline.record()})
        timeline.finish()
        record.update(timeline.record())
        self.run_dir.append_metrics(record)
        best = trees.best_episode(batch.episodes)
        if best is not None:
            seed = self.seed_workflows[best.benchmark].content_hash
            self.run_dir.append_tree(trees.episode_tree(best, iteration=iteration, root=seed))
        self.trackers.log(iteration, record)
        following = Timeline()
        await self._publish(record, timeline)
        return following

    def _checkpoint_due(self, iteration: int) -> bool:
        if not self.train_policy:
            return False
        done, every = iteration + 1, self.spec.trainer.checkpoint_every
        return done == self.spec.trainer.iterations or (every > 0 and done % every == 0)

    async def _checkpoint(self, record: dict[str, Any]) -> None:
        done = self.state.iteration
        path = Path(self.spec.trainer.checkpoint_dir) / "checkpoints" / f"iter-{done:06d}"
        self.state.metrics_lines = done
        self.state.last_record = record
        reply = await self.services.learner.save(str(path), self.state.to_bytes())
        self.index.add(
            CheckpointEntry(done, str(path), int(reply.policy_version)),
            self.spec.trainer.keep_checkpoints,
        )
        logger.info("checkpoint %s saved (%.1fs)", path, reply.seconds)

    # ---- learning -------------------------------------------------------------------------------

    async def _learn(self, batch: Batch, timeline: Timeline) -> dict[str, float]:
        """ComputeLogProbs, Train and the weight push for one batch; returns its metrics."""
        spec, learner = self.spec, self.services.learner
        algorithm = spec.learner.algorithm
        async with timeline.call():
            version = int((await learner.status()).policy_version)
        if version != self.state.policy_version:
            raise LearnerDivergedError(
                f"the learner is at policy v{version}, the trainer expects "
                f"v{self.state.policy_version}: it restarted (or another trainer drives it); "
                "restart the trainer to resume from the last checkpoint"
            )
        rows = batch.rows
        trainable = [i for i, r in enumerate(rows) if r.decision.trainable]
        values: list[list[float]] | None = None
        if algorithm.type == "ppo":
            with timeline.phase("logprob"):
                async with timeline.call():
                    scored = await learner.compute_logprobs(
                        [rows[i].decision for i in trainable], values=True
                    )
            values = [[] for _ in rows]
            for i, row_values in zip(trainable, scored.values or [], strict=True):
                values[i] = row_values
            if self.values is not None and self.values.source == "critic":
                self.values.record(
                    [rows[i] for i in trainable], [values[i][0] for i in trainable if values[i]]
                )
        with timeline.phase("advantage"):
            targets = compute_advantages(rows, algorithm, values=values)
        cap = spec.trainer.off_policy.max_staleness
        fresh = [i for i in trainable if version - rows[i].decision.version <= cap]
        stats: dict[str, float] = {
            "charts/rows_trained": float(len(fresh)),
            "charts/rows_dropped_stale": float(len(trainable) - len(fresh)),
            "charts/staleness_mean": mean([version - rows[i].decision.version for i in fresh]),
        }
        if not fresh:
            logger.warning("iteration %d: no row to train on", batch.iteration)
            return stats
        train_rows, extra = await self._train_rows(rows, fresh, targets, version, timeline)
        stats.update(extra)
        with timeline.phase("train"):
            async with timeline.call():
                learned, new_version = await learner.train(train_rows, batch.iteration)
        self.state.policy_version = new_version
        stats.update(learned)
        report = await self._push(timeline)
        stats["weights/seconds"] = report.seconds
        stats["weights/replicas_failed"] = float(len(report.failed))
        return stats

    async def _train_rows(
        self,
        rows: list[StepRow],
        fresh: list[int],
        targets: RowTargets,
        version: int,
        timeline: Timeline,
    ) -> tuple[list[TrainRow], dict[str, float]]:
        """Training samples: old log-probs (recomputed where needed), IS-weighted advantages."""
        spec, learner = self.spec, self.services.learner
        recompute_all = recompute_all_old_logprobs(spec)
        redo = [i for i in fresh if recompute_all or rows[i].decision.version != version]
        old: dict[int, list[float]] = {}
        old_candidates: dict[int, list[float]] = {}
        with timeline.phase("logprob"):
            if redo:
                async with timeline.call():
                    scored = await learner.compute_logprobs([rows[i].decision for i in redo])
                old = dict(zip(redo, scored.logprobs, strict=True))
                old_candidates = dict(zip(redo, scored.candidates or [], strict=False))
        cap = spec.trainer.off_policy.importance_weight_cap
        weights: list[float] = []
        out = []
        candidate_flat: list[float] = []
        for i in fresh:
            decision = rows[i].decision
            advantages = np.array(targets.advantages[i], dtype=np.float64)
            old_logprobs = np.array(decision.logprobs, dtype=np.float64)
            candidates = decision.candidate_logprobs
            if i in old:
                # Decoupled PPO: w_t = min(pi_old / pi_behaviour, C) corrects the sampling. The
                # all-action term is an expectation under the proximal policy: no weight.
                proximal = np.array(old[i], dtype=np.float64)
                weight = np.minimum(np.exp(proximal - old_logprobs), cap)
                advantages = advantages * weight
                old_logprobs = proximal
                weights.extend(weight.tolist())
                candidates = tuple(old_candidates.get(i) or candidates)
            candidate_advantages = (
                targets.candidate_advantages[i] if targets.candidate_advantages else ()
            )
            candidate_flat.extend(candidate_advantages)
            out.append(
                TrainRow(
                    decision,
                    old_logprobs.tolist(),
                    advantages.tolist(),
                    returns=targets.returns[i] if targets.returns else (),
                    old_values=targets.old_values[i] if targets.old_values else (),
                    value_target=targets.value_targets[i] if targets.value_targets else None,
                    candidate_old_logprobs=candidates,
                    candidate_advantages=candidate_advantages,
                )
            )
        flat = np.concatenate([np.asarray(r.advantages) for r in out])
        extra = {
            "charts/advantage_mean": float(flat.mean()),
            "charts/advantage_std": float(flat.std()),
            "charts/advantage_abs_mean": float(np.abs(flat).mean()),
            "charts/is_weight_mean": mean(weights),
            "charts/rows_recomputed": float(len(redo)),
        }
        if candidate_flat:
            sibling = np.asarray(candidate_flat)
            extra["charts/candidate_advantage_std"] = float(sibling.std())
            extra["charts/candidate_advantage_abs_mean"] = float(np.abs(sibling).mean())
            extra["charts/sibling_rows"] = float(sum(1 for r in out if r.candidate_advantages))
        return out, extra

    async def _push(self, timeline: Timeline) -> Any:
        with timeline.phase("weight_sync"):
            async with timeline.call():
                report = await self.services.weights.push()
        if not report.ok:
            failed = ", ".join(f"{r.target} ({r.error})" for r in report.failed)
            logger.warning("weights v%d did not reach: %s", report.version, failed)
        return report

    # ---- records --------------------------------------------------------------------------------

    def _note_workflows(self, batch: Batch) -> None:
        """Offer the iteration's evaluated workflows (and the seed) to their benchmark's best
        list."""
        for episode in batch.episodes:
            seed = self.seed_workflows[episode.benchmark]
            self.state.offer(
                episode.benchmark,
                BestWorkflow(
                    seed.content_hash,
                    episode.seed_score,
                    batch.iteration,
                    "seed",
                    seed.to_json(indent=None),
                ),
                KEEP_BEST,
            )
            for row in episode.rows:
                if not (row.valid and row.child_hash) or row.duplicate:
                    continue
                self.state.offer(
                    episode.benchmark,
                    BestWorkflow(
                        row.child_hash,
                        row.child_score,
                        batch.iteration,
                        episode.episode_id,
                        row.child_workflow_json or None,
                    ),
                    KEEP_BEST,
                )

    def _record(self, batch: Batch, learned: dict[str, float]) -> dict[str, Any]:
        routing = self.services.env.take_stats()
        record: dict[str, Any] = {
            "iteration": batch.iteration,
            "time": utc_now(),
            "policy_version": self.state.policy_version,
            **collecting.batch_summary(batch),
            "charts/best_score": self.state.best_score,
            "charts/episodes_total": float(self.state.episodes),
            "env/failovers": float(len(routing.failovers)),
            "env/replicas_live": float(len(self.services.env.live_addresses())),
            **learned,
        }
        if len(self.benchmarks) > 1:
            record.update(collecting.benchmark_summary(batch))
            for name, kept in self.state.best.items():
                if kept:
                    record[f"charts/best_score/{name}"] = kept[0].score
        return record

    def _best_folder(self, benchmark: str) -> str:
        """``best`` for a run on one benchmark, ``best/<benchmark>`` for several."""
        return "best" if len(self.benchmarks) == 1 else f"best/{benchmark}"

    def _best_snapshot(self) -> dict[str, list[BestWorkflow]]:
        """The best lists as they are now (an overlapping collection may change them)."""
        return {name: list(kept) for name, kept in self.state.best.items()}

    def _write_best(self, best: dict[str, list[BestWorkflow]]) -> None:
        for name, kept in best.items():
            self.run_dir.write_best(kept, benchmark=name, subdir=self._best_folder(name))

    def _draw(self, records: list[dict[str, Any]], best: dict[str, list[BestWorkflow]]) -> None:
        self.run_dir.plot_curves(records)
        self._write_best(best)

    async def _settle_pictures(self) -> None:
        """Wait for the pictures being drawn, if any (a failure is logged, not raised)."""
        task, self._pictures = self._pictures, None
        if task is None:
            return
        try:
            await task
        except Exception:
            logger.exception("drawing the run's pictures failed")

    async def _publish(self, record: dict[str, Any], timeline: Timeline) -> None:
        """Progress, Prometheus, curves, best workflows and the run's status."""
        m = self.metrics
        m.iteration.set(self.state.iteration)
        m.mean_reward.set(_finite(record["charts/episode_return"]))
        m.best_score.set(_finite(record["charts/best_score"]))
        m.iteration_best_score.set(_finite(record["charts/iteration_best_score"]))
        m.valid_action_ratio.set(_finite(record["charts/valid_action_ratio"]))
        m.policy_version.set(self.state.policy_version)
        m.episodes.inc(record["charts/episodes"])
        m.sibling_executor_calls.inc(record.get("env/sibling_executor_calls", 0.0))
        if "charts/advantage_std" in record:
            m.advantage_std.set(_finite(record["charts/advantage_std"]))
        if "charts/candidate_advantage_std" in record:
            m.candidate_advantage_std.set(_finite(record["charts/candidate_advantage_std"]))
        if "noise/reward_noise_sd" in record:
            m.reward_noise_sd.set(_finite(record["noise/reward_noise_sd"]))
        if "noise/signal_to_noise" in record:
            m.reward_signal_to_noise.set(_finite(record["noise/signal_to_noise"]))
        m.resampled_steps.inc(record.get("noise/resampled_steps", 0.0))
        for name, seconds in timeline.phases.items():
            m.phase_duration.labels(name).observe(seconds)
        m.iteration_duration.observe(timeline.total_s)
        m.overhead.set(record["time/overhead_ratio"])
        for name, kept in self.state.best.items():
            if kept:
                m.benchmark_best_score.labels(name).set(kept[0].score)
        several = len(self.benchmarks) > 1
        for name in self.benchmarks:
            value = record.get(
                f"charts/episode_return/{name}" if several else "charts/episode_return"
            )
            if value is not None:
                m.benchmark_episode_reward.labels(name).set(_finite(value))
        # Pictures (curves.png, the best workflows' folders) are drawn on a thread while the
        # next iteration runs: the previous drawing is waited for first (one at a time, in
        # order), and the last one before the run ends (:meth:`_settle_pictures`).
        await self._settle_pictures()
        self._pictures = asyncio.create_task(
            asyncio.to_thread(self._draw, self.run_dir.read_metrics(), self._best_snapshot())
        )
        if self.progress is not None:
            self.progress.iteration_done(record)
        if self.reporter is not None:
            # The run's best workflow: one only when the run trains on one benchmark.
            kept = self.state.best.get(self.benchmarks[0], []) if len(self.benchmarks) == 1 else []
            best = kept[0] if kept else None
            await self.reporter.areport(
                iteration=self.state.iteration,
                best_score=self.state.best_score,
                seed_score=_finite_or_none(record["charts/seed_score"]),
                mean_reward=_finite_or_none(record["charts/episode_return"]),
                valid_action_ratio=_finite_or_none(record["charts/valid_action_ratio"]),
                policy_version=self.state.policy_version,
                best_workflow=best.hash if best else None,
            )

    # ---- the final comparison -------------------------------------------------------------------

    async def final_evaluation(self) -> dict[str, list[FinalRow]]:
        """The final comparison of every training and held-out benchmark (:mod:`.final`)."""
        if self.progress is not None:
            self.progress.write(
                "evaluating the best workflows and the baselines on validation and test"
            )
        await self.services.env.refresh()
        return await final_comparison(
            self.services.env,
            self.state.best,
            self.seed_workflows,
            training=self.benchmarks,
            held_out=self.spec.environment.held_out_benchmarks,
            repeats=self.spec.environment.evaluation.repeats,
            seed=self.spec.trainer.seed,
        )

    async def _finish(self, result: RunResult) -> None:
        """The final comparison (and, with held-out benchmarks, the policy on held-out tasks),
        written to ``final.json``, ``final.md`` and ``held_out.json``."""
        held_out = self.spec.environment.held_out_benchmarks
        by_benchmark = await self.final_evaluation()
        tables = [
            final_table(rows, benchmark=name, held_out=name in held_out)
            for name, rows in by_benchmark.items()
        ]
        result.final_rows = [row for rows in by_benchmark.values() for row in rows]
        if self.progress is not None:
            self.progress.write(
                "playing the trained policy and the random proposer on held-out tasks"
            )
        result.held_out, random = await proposer_comparison(
            self.spec, self.services.env, self.actor
        )
        result.random_held_out = random
        result.start_held_out = self.start_held_out
        proposers = [("trained policy (fused)", result.held_out)]
        if self.start_held_out:
            proposers.append(("policy it started from (fused)", self.start_held_out))
        proposers.append(("random proposer (ucb)", random))
        tables.append(
            comparison_table(
                proposers,
                title="The trained policy against the policy RL started from and the random "
                "proposer, on held-out tasks (problems no training task had; the same tasks, "
                "one episode each, and the same evaluation budget)",
            )
        )
        summary = [
            sentence
            for sentence in (
                *(best_against_baselines(rows) for rows in by_benchmark.values()),
                lead_sentence(result.held_out, self.start_held_out, random=random),
            )
            if sentence
        ]
        if summary:
            tables.append("In short: " + " ".join(summary))
        if held_out:
            summaries = summarize(result.held_out, held_out=held_out)
            tables.append(
                policy_table(
                    summaries,
                    title="The final policy on held-out tasks (task seeds training never drew; "
                    "held-out benchmarks: transfer)",
                )
            )
            self.run_dir.write_held_out(
                [e.to_dict() for e in result.held_out], [s.to_dict() for s in summaries]
            )
        result.final_table = "\n\n".join(tables)
        self.run_dir.write_final([r.to_dict() for r in result.final_rows], result.final_table)
        for name in self.benchmarks:
            rows = by_benchmark[name]
            chosen = rows[0].hash if rows else ""
            for rank, best in enumerate(self.state.best.get(name, []), 1):
                if best.hash == chosen:
                    folder = self.run_dir.path / self._best_folder(name)
                    result.best_dirs[name] = folder / f"{rank}-{best.hash[:12]}"
        if len(self.benchmarks) == 1:
            result.best_dir = result.best_dirs.get(self.benchmarks[0])


def _finite(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else 0.0


def _finite_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None
