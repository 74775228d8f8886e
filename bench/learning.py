"""Does the policy learn to improve workflows? GiGPO against the baselines a sceptic would name.

One set of local services runs everything: environment replicas serving five training
benchmarks (gsm8k, math, humaneval, hotpotqa, drop) and one held-out benchmark (mbpp) with the
surrogate executor, an hf rollout and a learner. The learner's initial weights are saved once and
reloaded (its version lifted above the rollout's) before each trained method, so every method
starts from the same fresh built-in policy. Methods, each with ``--seeds`` (3) seeds; a seed
fixes the training tasks, the warm start's traces and all sampling:

- ``warm-start``: the supervised warm start only (``trainer.warmStart``: behaviour episodes in
  which every listed action is stepped, the policy trained towards the best-rewarded ones);
- ``gigpo``: the warm start, then ``--iterations`` of GiGPO (episode + step groups);
- ``grpo``: the warm start, then the same iterations of GRPO (episode groups only);
- ``random``: uniform over the admissible actions;
- ``constant``: the best state-blind constant policy, "always the k-th listed action": every k
  is tried on selection tasks drawn from the training benchmarks (not the evaluation tasks),
  and the best k is then played on the evaluation tasks.

**Training settings** (defaults): the tiny preset; the warm start labels ``--warm-episodes``
(40) behaviour episodes and trains ``--warm-epochs`` (3) passes at ``--warm-lr`` (3e-3) with the
value replies' loss at ``--warm-value-coef`` (0.5); GiGPO and GRPO then run ``--iterations``
(10) of 5 tasks x 4 episodes at ``--lr`` (3e-4) with that loss at ``--value-coef`` (0.05). At the
warm start's rate and value weight, RL undid most of the warm start's lead (best-gain +0.065 ->
+0.052 over 3 seeds, in the run that chose these settings).

**Evaluation** (paired: every method and seed plays the same tasks; nothing is trained):
``--eval-tasks`` held-out tasks of each training benchmark (task seeds training never draws)
and of the held-out benchmark (transfer), ``--eval-episodes`` episodes each. The trained
policies search as the product does, with fused selection on their own values; the value-less
baselines with UCB (the same c: fused selection with an empty value table). The row ``gigpo
(ucb)`` plays the GiGPO policy with UCB too,
so the proposals' effect is seen apart from the selection rule's.

**Measured**, per method (mean ± standard error over the seeds, each seed's value the mean over
its evaluation episodes):

- *best-gain*: the best score among the workflows an episode added minus the seed workflow's
  (the episode's headline), on held-out tasks of the training benchmarks and on the held-out
  benchmark;
- *duplicates*: the share of steps into a workflow the tree already held;
- *test vs baselines*: per benchmark, the method's best workflow (chosen on the whole validation
  split among the ``--test-candidates`` (3) best new workflows of its evaluation episodes, all
  seeds) scored on test problems minus the best classic baseline (IO, CoT, CoT-SC, MedPrompt,
  Self-Refine) on the same problems;
- *state-TV*: the mean total variation between the GiGPO policy's action distributions over the
  listed positions, across 24 states (6 benchmarks x the seed, CoT-SC, MedPrompt and Self-Refine
  workflows): a policy that ignores its input scores 0; *shuffle*: the distribution of every one
  of those states, with its candidate list permuted, is the permuted distribution (ok), else
  FAIL.

The last line is ``learning: gigpo-random=+X.X SE gigpo-constant=+Y.Y SE state-TV=Z.ZZZ
shuffle=ok``: GiGPO's lead in best-gain (all evaluation tasks) over random and over the best
constant, in standard errors of the difference, sqrt(se_a^2 + se_b^2).

    python bench/learning.py [--seeds 0 1 2] [--iterations N] [--warm-episodes E] \\
        [--eval-tasks T] [--eval-episodes K] [--preset tiny|small] [--data-dir DIR] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aflowrl._proto.v1 import environment_pb2, rollout_pb2
from aflowrl.benchmarks import get_benchmark
from aflowrl.config import RunSpec
from aflowrl.errors import NotFoundError
from aflowrl.local.launcher import local_services, local_spec
from aflowrl.search import encoding
from aflowrl.trainer import app, final
from aflowrl.trainer.acting import (
    Actor,
    IndexActor,
    UniformActor,
    action_log_probs,
    prompt_of,
)
from aflowrl.trainer.clients import EnvironmentClient, LearnerClient, RolloutClient
from aflowrl.trainer.evaluate import EpisodeResult, evaluate_policy, policy_actor
from aflowrl.trainer.tasks import Task, held_out_tasks
from aflowrl.trainer.values import ValueTable
from aflowrl.workflow import Graph, library

TRAIN = ("gsm8k", "math", "humaneval", "hotpotqa", "drop")
HELD_OUT = ("mbpp",)
TV_WORKFLOWS = ("seed", "cot_sc", "medprompt", "self_refine")
BENCHMARKS = (*TRAIN, *HELD_OUT)
LISTED = 9
"""Admissible actions listed per observation (the constants try each position)."""

SPEC = """
policy: {{model: {preset}, dtype: float32, value: {{lossCoef: {value_coef}}}}}
learner:
  fsdp: {{mixedPrecision: none}}
  optimizer: {{lr: {lr}}}
  loss: {{miniBatchSize: 10, microBatchSize: 5, epochs: 1, klCoef: 0.0}}
environment:
  benchmarks: {train}
  heldOutBenchmarks: {held_out}
  data: {{dir: {data_dir}}}
  executor: {{type: surrogate}}
  replicas: {{min: 2, max: 2}}
  evaluation: {{maxProblems: {problems}, repeats: 1}}
  search:
    maxSteps: {steps}
    maxAdmissibleActions: {listed}
    maxObservationChars: 6000
    failedExamples: 1
    describeOperators: false
    selection: fused
    valueSource: policy
    ucbC: {ucb_c}
trainer:
  iterations: {iterations}
  tasksPerIteration: 5
  groupSize: 4
  checkpointEvery: 0
  finalTestEval: false
  warmStart: {{episodes: {warm}, temperature: {tau}, epochs: {epochs}, lr: {warm_lr},
    valueLossCoef: {warm_value_coef}}}
"""


def _spec(args: argparse.Namespace, **trainer: Any) -> RunSpec:
    text = SPEC.format(
        preset=args.preset,
        lr=args.lr,
        warm_lr=args.warm_lr,
        value_coef=args.value_coef,
        warm_value_coef="null" if args.warm_value_coef is None else args.warm_value_coef,
        train=list(TRAIN),
        held_out=list(HELD_OUT),
        data_dir=args.data_dir,
        problems=args.problems,
        steps=args.steps,
        listed=LISTED,
        ucb_c=args.ucb_c,
        iterations=args.iterations,
        warm=args.warm_episodes,
        tau=args.tau,
        epochs=args.warm_epochs,
    )
    spec = RunSpec.from_yaml(text, source="bench/learning.py")
    doc = spec.to_document()
    doc["trainer"].update(trainer)
    return RunSpec.from_document(doc)


def _mean_se(values: Sequence[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
    return mean, se


@dataclass
class Scores:
    """One method's per-seed figures."""

    gain: list[float] = field(default_factory=list)
    gain_train: list[float] = field(default_factory=list)
    gain_held_out: list[float] = field(default_factory=list)
    duplicates: list[float] = field(default_factory=list)
    episodes: list[EpisodeResult] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, played: Sequence[EpisodeResult]) -> None:
        self.gain.append(statistics.fmean(_gain(e) for e in played))
        self.gain_train.append(statistics.fmean(_gain(e) for e in played if e.benchmark in TRAIN))
        self.gain_held_out.append(
            statistics.fmean(_gain(e) for e in played if e.benchmark in HELD_OUT)
        )
        steps = sum(e.steps for e in played)
        self.duplicates.append(sum(e.duplicates for e in played) / max(1, steps))
        self.episodes.extend(played)


def _gain(episode: EpisodeResult) -> float:
    return episode.best_gain


class Bench:
    """The services and clients every method shares."""

    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args = args
        self.root = root
        self.base = local_spec(_spec(args), root)
        self.scores: dict[str, Scores] = {}
        self.tv: float = math.nan
        self.shuffle_ok = False
        self.tv_note = ""
        self.test_margin: dict[str, dict[str, float]] = {}
        """Method -> benchmark -> best workflow's test score minus the best classic's."""

    def evaluation_tasks(self) -> list[Task]:
        """The same for every method and seed (a paired comparison)."""
        return held_out_tasks(TRAIN + HELD_OUT, self.args.eval_tasks, seed=10_007)

    async def play(
        self, spec: RunSpec, actor: Actor, tasks: list[Task], seed: int, *, ucb: bool = False
    ) -> list[EpisodeResult]:
        """``ucb``: search with an empty value table (fused selection = UCB alone)."""
        return await evaluate_policy(
            spec,
            self.env,
            actor,
            tasks,
            episodes_per_task=self.args.eval_episodes,
            seed=seed,
            values=ValueTable.empty() if ucb else None,
        )

    async def run(self) -> None:
        args = self.args
        async with local_services(self.base, self.root) as (targets, _group):
            self.targets = targets
            self.learner = LearnerClient(targets.learner)
            self.rollout = RolloutClient(targets.rollout)
            self.env = EnvironmentClient(targets.env, step_timeout_s=1800.0)
            initial = self.root / "initial-policy"
            await self.learner.save(str(initial), b"")
            try:
                await self._baselines()
                for seed in args.seeds:
                    await self._trained(seed, initial)
                await self._state_dependence()
                await self._test_vs_baselines()
            finally:
                await self.learner.close()
                await self.rollout.close()
                await self.env.close()

    async def _baselines(self) -> None:
        args, tasks = self.args, self.evaluation_tasks()
        base = self.base
        started = time.perf_counter()
        random = self.scores.setdefault("random", Scores())
        for seed in args.seeds:
            random.add(await self.play(base, UniformActor(), tasks, seed, ucb=True))
        random.seconds = time.perf_counter() - started
        _report("random", random)
        # The best constant, chosen on tasks drawn from the training benchmarks (not the
        # evaluation tasks): every position k is tried.
        started = time.perf_counter()
        selection = [Task(name, 1_000 + k) for name in TRAIN for k in range(args.selection_tasks)]
        tried = {}
        for k in range(LISTED):
            played = await evaluate_policy(
                base, self.env, IndexActor(k), selection, seed=0, values=ValueTable.empty()
            )
            tried[k] = statistics.fmean(_gain(e) for e in played)
        best = max(tried, key=lambda k: tried[k])
        constant = self.scores.setdefault(f"constant (k={best + 1})", Scores())
        for seed in args.seeds:
            constant.add(await self.play(base, IndexActor(best), tasks, seed, ucb=True))
        constant.seconds = time.perf_counter() - started
        self.constant = f"constant (k={best + 1})"
        print(
            "constants on the selection tasks: "
            + ", ".join(f"k={k + 1} {v:+.4f}" for k, v in tried.items()),
            flush=True,
        )
        _report(self.constant, constant)

    async def _fresh(self, initial: Path) -> None:
        top = max((await self.rollout.versions()).values())
        await self.learner.load(str(initial), min_policy_version=top + 1)

    async def _train(self, spec: RunSpec, run_dir: Path) -> None:
        services = app.connect(
            spec, env=self.targets.env, rollout=self.targets.rollout, learner=self.targets.learner
        )
        await app.train(spec, services, run_dir)

    async def _trained(self, seed: int, initial: Path) -> None:
        args, tasks = self.args, self.evaluation_tasks()
        # The warm start alone: zero RL iterations.
        warm_dir = self.root / f"warm-{seed}"
        await self._fresh(initial)
        started = time.perf_counter()
        warm_spec = _spec(args, seed=seed, iterations=0, checkpointDir=str(warm_dir))
        await self._train(warm_spec, warm_dir)
        warm_ckpt = self.root / f"warm-checkpoint-{seed}"
        await self.learner.save(str(warm_ckpt), b"")
        scores = self.scores.setdefault("warm-start", Scores())
        scores.add(await self.play(warm_spec, policy_actor(warm_spec, self.rollout), tasks, seed))
        scores.seconds += time.perf_counter() - started
        _report(f"warm-start seed {seed}", scores, last=True)
        for method in ("gigpo", "grpo"):
            if method not in args.methods:
                continue
            top = max((await self.rollout.versions()).values())
            await self.learner.load(str(warm_ckpt), min_policy_version=top + 1)
            started = time.perf_counter()
            run_dir = self.root / f"{method}-{seed}"
            spec = _spec(args, seed=seed, checkpointDir=str(run_dir))
            doc = spec.to_document()
            doc["trainer"]["warmStart"]["episodes"] = 0  # already warm
            if method == "grpo":
                doc["learner"]["algorithm"] = {"type": "grpo"}
            spec = RunSpec.from_document(doc)
            await self._train(spec, run_dir)
            actor = policy_actor(spec, self.rollout)
            scores = self.scores.setdefault(method, Scores())
            scores.add(await self.play(spec, actor, tasks, seed))
            scores.seconds += time.perf_counter() - started
            _report(f"{method} seed {seed}", scores, last=True)
            if method == "gigpo":
                plain = self.scores.setdefault("gigpo (ucb)", Scores())
                plain.add(await self.play(spec, actor, tasks, seed, ucb=True))
                _report(f"gigpo (ucb) seed {seed}", plain, last=True)

    async def _state_dependence(self) -> None:
        """state-TV and the shuffle check on the last GiGPO policy (module docstring)."""
        spec = self.base
        distributions: list[np.ndarray] = []
        shuffled_ok = True
        rng = np.random.default_rng(0)
        for name in (*TRAIN, *HELD_OUT):
            task_type = get_benchmark(name).task_type
            for workflow in TV_WORKFLOWS:
                graph = library.load(workflow, task_type)
                reply = await self.env.reset(
                    environment_pb2.ResetRequest(
                        task=name,
                        seed=10_007,
                        max_steps=spec.environment.search.max_steps,
                        seed_workflow_json=graph.to_json(indent=None),
                        values=environment_pb2.StateValues(),
                    ),
                    key=graph.content_hash,
                )
                actions = list(reply.observation.admissible_actions)[:LISTED]
                text = reply.observation.text
                log_pi = await self._distribution(text, actions)
                padded = np.zeros(LISTED)
                padded[: len(actions)] = np.exp(log_pi)
                distributions.append(padded)
                order = rng.permutation(len(actions))
                permuted = await self._distribution(text, [actions[k] for k in order])
                if not np.allclose(permuted, log_pi[order], atol=1e-4):
                    shuffled_ok = False
        pairs = list(itertools.combinations(distributions, 2))
        self.tv = statistics.fmean(0.5 * float(np.abs(a - b).sum()) for a, b in pairs)
        self.shuffle_ok = shuffled_ok

    async def _test_vs_baselines(self) -> None:
        """Per method and benchmark: its best workflow's test score minus the best classic's.

        The candidates are the method's evaluation episodes' best new workflows (all seeds; the
        ``--test-candidates`` with the highest episode scores), the best of them on the whole
        validation split is tested with the classic baselines on the test split
        (:func:`aflowrl.trainer.final.compare`: same problems, same seed).
        """
        seeds = {name: library.load("seed", get_benchmark(name).task_type) for name in BENCHMARKS}
        for method, scores in self.scores.items():
            if method == "gigpo (ucb)":
                continue  # the same policy as gigpo
            for name in BENCHMARKS:
                played = [
                    e for e in scores.episodes if e.benchmark == name and e.best_workflow_json
                ]
                played.sort(key=lambda e: e.best_gain, reverse=True)
                pool: dict[str, final.Contender] = {}
                for episode in played:
                    graph = Graph.from_json(episode.best_workflow_json or "", source=method)
                    if graph.content_hash != seeds[name].content_hash:
                        pool.setdefault(
                            graph.content_hash, final.Contender(graph.content_hash[:8], graph)
                        )
                    if len(pool) >= self.args.test_candidates:
                        break
                try:
                    rows = await final.compare(
                        self.env,
                        list(pool.values()),
                        final.baselines(seeds[name]),
                        benchmark=name,
                        repeats=1,
                        seed=0,
                    )
                except NotFoundError:  # no test split (AFlow's HotpotQA has none)
                    continue
                classic = max(r.test_mean for r in rows if r.name in library.CLASSIC)
                best = rows[0].test_mean if pool else seeds_score(rows)
                self.test_margin.setdefault(method, {})[name] = best - classic

    async def _distribution(self, text: str, actions: list[str]) -> np.ndarray:
        item = rollout_pb2.CandidateSet(
            prompt=prompt_of(text), candidates=encoding.action_replies(actions)
        )
        [(scores, _)] = await self.rollout.score([item])
        return action_log_probs(scores, len(actions))


def seeds_score(rows: Sequence[final.FinalRow]) -> float:
    """The seed's test score (a method that added no workflow keeps the seed)."""
    return next(r.test_mean for r in rows if r.name == "seed")


def _report(name: str, scores: Scores, *, last: bool = False) -> None:
    gains = scores.gain[-1:] if last else scores.gain
    print(
        f"{name:>24}: best-gain {statistics.fmean(gains):+.4f}, duplicates "
        f"{statistics.fmean(scores.duplicates[-len(gains) :]):.3f} ({scores.seconds:.0f} s)",
        flush=True,
    )


def _margin(a: Scores, b: Scores) -> float:
    (ma, sa), (mb, sb) = _mean_se(a.gain), _mean_se(b.gain)
    return (ma - mb) / math.sqrt(sa**2 + sb**2) if sa > 0 or sb > 0 else math.inf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=["gigpo", "grpo"])
    parser.add_argument("--preset", default="tiny", choices=["tiny", "small", "base"])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warm-episodes", type=int, default=40)
    parser.add_argument("--warm-epochs", type=int, default=3)
    parser.add_argument("--tau", type=float, default=0.05)
    parser.add_argument("--lr", type=float, default=0.0003, help="RL (learner.optimizer.lr)")
    parser.add_argument("--warm-lr", type=float, default=0.003, help="trainer.warmStart.lr")
    parser.add_argument("--value-coef", type=float, default=0.05, help="policy.value.lossCoef")
    parser.add_argument(
        "--warm-value-coef", type=float, default=0.5, help="trainer.warmStart.valueLossCoef"
    )
    parser.add_argument("--problems", type=int, default=20, help="validation problems per task")
    parser.add_argument("--steps", type=int, default=4, help="edits per episode")
    parser.add_argument("--ucb-c", type=float, default=0.1)
    parser.add_argument("--eval-tasks", type=int, default=4, help="per benchmark")
    parser.add_argument("--eval-episodes", type=int, default=3, help="per task")
    parser.add_argument("--selection-tasks", type=int, default=2, help="per training benchmark")
    parser.add_argument(
        "--test-candidates", type=int, default=3, help="per method and benchmark, see above"
    )
    parser.add_argument("--data-dir", default=os.environ.get("AFLOWRL_DATA_DIR"))
    parser.add_argument("--keep", metavar="DIR", help="keep every run's directory under DIR")
    args = parser.parse_args()
    if not args.data_dir:
        sys.exit("bench/learning.py needs the AFlow splits: --data-dir DIR or $AFLOWRL_DATA_DIR")
    started = time.perf_counter()
    if args.keep:
        bench = Bench(args, Path(args.keep))
        asyncio.run(bench.run())
    else:
        with tempfile.TemporaryDirectory(prefix="aflowrl-learning-") as tmp:
            bench = Bench(args, Path(tmp))
            asyncio.run(bench.run())
    print(
        f"\n{'method':<24}{'best-gain':>18}{'training bm':>18}{'held-out bm':>18}{'duplicates':>12}"
    )
    for name, s in bench.scores.items():
        cells = [_mean_se(s.gain), _mean_se(s.gain_train), _mean_se(s.gain_held_out)]
        print(
            f"{name:<24}"
            + "".join(f"{m:>+10.4f} ± {se:.4f}" for m, se in cells)
            + f"{statistics.fmean(s.duplicates):>12.3f}"
        )
    names = [*TRAIN, *(f"{n} (held out)" for n in HELD_OUT)]
    print(
        "\ntest split, each method's best workflow (chosen on the whole validation split among its"
        " evaluation episodes' best) minus the best classic baseline (IO, CoT, CoT-SC, MedPrompt,"
        " Self-Refine):"
    )
    print(f"{'method':<24}" + "".join(f"{n:>18}" for n in names) + f"{'mean':>9}")
    for method, margins in bench.test_margin.items():
        margin = [margins.get(n) for n in BENCHMARKS]
        print(
            f"{method:<24}"
            + "".join(f"{'no test split':>18}" if c is None else f"{c:>+18.3f}" for c in margin)
            + f"{statistics.fmean(c for c in margin if c is not None):>+9.3f}"
        )
    print(f"({time.perf_counter() - started:.0f} s in all)")
    gigpo = bench.scores["gigpo"]
    print(
        f"learning: gigpo-random={_margin(gigpo, bench.scores['random']):+.1f} SE "
        f"gigpo-constant={_margin(gigpo, bench.scores[bench.constant]):+.1f} SE "
        f"state-TV={bench.tv:.3f} shuffle={'ok' if bench.shuffle_ok else 'FAIL'}"
    )


if __name__ == "__main__":
    main()
