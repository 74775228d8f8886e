"""Does GiGPO make the policy better than the policy it started from? A bench that cannot flatter.

One set of local services (environment replicas with the surrogate executor, an hf rollout and
a learner) serves four training benchmarks (gsm8k, math, hotpotqa, drop) and one held-out
benchmark (mbpp). The held-out benchmark is a code task: its seed workflow lists actions
(``wrap generate in test_fix``, ``replace generate with CustomCodeGenerate``...) that no
training benchmark shows, so its row measures transfer to an unseen action list.

**Problems never overlap.** Each benchmark's validation problems are split into disjoint pools
(``environment.evaluation.pools``: 30 % held out, 20 % tuning, 50 % training; by a stable hash of
the problem id). Training tasks, the warm start's episodes and the expected-greedy table use the
training pool; settings (the defaults below, ``--split tuning``; ``--try-iterations`` and
``--try-value-scales`` play GiGPO at other iteration counts and value weights in the same run,
paired) were chosen on tuning-pool tasks; every figure of the evaluation (``--split eval``, the
default) comes from tasks on problems no training or tuning task sees: ``--eval-tasks`` (7) per
training benchmark (28 tasks) and as many of mbpp, each ``--problems`` (20) problems,
``--eval-episodes`` (1) episode per task and seed (with more, a (task, seed) cell's figure is their
mean).

**The units of the standard errors are problems and seeds.** GSM8K, MATH, DROP and MBPP
evaluation tasks play the ``test`` problem pool: task k takes chunk k of its benchmark's test
split (1,055, 486, 400 and 341 problems, in 20-problem chunks; consecutive task seeds, so no
problem is in two tasks, and none is in the validation split every training and tuning task
draws from): such a task is a unit of its own, a set of problems no other unit holds. HotpotQA
has no test split: its 7 tasks draw 20 problems each from a held-out validation pool of about
60, so they share problems, and the bootstrap draws them together as one unit (a cluster
weighing 7 tasks): the SE then treats HotpotQA as one draw, never as 7 independent ones.
Every figure is a mean over (task, seed) cells; every difference is paired by (task, seed); its
standard error is a two-way cluster bootstrap (Davison & Hinkley's "pigeonhole" scheme:
``--bootstrap`` 2000 resamples of the units and, independently, of the seeds, with
replacement, :func:`aflowrl.rl.yardstick.two_way_bootstrap`), so unit-to-unit and
seed-to-seed variance both enter it and a deterministic baseline does not get an SE of zero.
"+X SE" is mean / SE of the paired difference. (With ``--split tuning`` every benchmark's tasks
share its tuning pool: each benchmark is one unit, and the SEs are wide.)

**The search and its reward**: ``--steps`` (10) edits per episode from AFlow's seed workflow
(AFlow searches for up to 20 rounds; at 4 steps parent selection hardly matters), 9 actions
listed, none leading to a workflow the tree holds (``search.listDuplicates: false``, so every
step evaluates one new workflow and two searches of equal length spend equal evaluations), and
the ``improvement`` reward, max(0, child - best so far), so that an episode's return is its
best-gain, the figure this bench judges (``--reward``; the defaults below were chosen on tuning
tasks, docs/guides/presets.md).

**Methods**, each trained and evaluated once per seed (``--seeds``, 0 1; a seed fixes the
warm start's traces, training tasks and all sampling):

- ``warm start``: the supervised warm start (``trainer.warmStart``) from the fresh policy;
- ``gigpo``: the warm start, then ``--iterations`` of GiGPO (``mean_std_norm``, sibling step
  groups, several PPO epochs, the exact KL to the warm start); it searches as the product
  does, ``fused`` selection on its own values;
- ``gigpo (ucb)``: the same trained policy proposing, the parent chosen by UCB alone (every
  V(s) the same): ``fused-ucb`` is gigpo - gigpo (ucb), paired by task and seed, at equal
  evaluation budget (same tasks, steps and seeds; every step evaluates one new workflow);
- ablations, off by default (``--methods gigpo grpo equal-budget``; they cost two thirds of
  the time and no verdict reads them): ``grpo`` (the same iterations of GRPO, episode groups
  only) and ``warm start (equal budget)`` (the warm start alone with as many more labelled
  episodes as make its workflow evaluations match warm start + GiGPO's).

**Reference rows** (no training; UCB alone, the same c): ``random`` (uniform over the listed
actions); ``uniform new`` (uniform over the listed actions that do not lead to a workflow the
tree holds: the same as random while the listing leaves those out); ``constant`` (always the
k-th listed action, k chosen on tuning tasks); ``expected-greedy`` (at each state, the listed
action with the highest mean one-step reward over ``--greedy-tasks`` (6) training-pool tasks
of the benchmark started from the same workflow: the best a policy that generalises across
tasks can do one step at a time; its row has its own SE like every row); ``oracle``: the
*cross-fitted* one-step oracle: at each state every listed action is evaluated on the task
itself, and the action whose child scores best on executor sample 1 is taken, while the search
pays its reward on sample 0 (the same problems and workflows, another run of the executor).
Choosing and scoring on one sample (the earlier ceiling) counts the executor's noise as skill:
bench/reward_noise.py measured that lead at +0.039 on GSM8K and +0.127 on MATH, cross-fitted
+0.011 and +0.022. The held-out-state table prints both, and the effective number of distinct
actions per state: listed actions whose children score alike on every problem and sample
(both samples) count once. ``learnable-share`` = (gigpo - random) / (oracle - random) in
best-gain, the oracle cross-fitted.

**Metrics.** *best-gain*: the best score among the workflows an episode added minus the seed
workflow's. *one-step*: the exact expected one-step reward E_{a~pi} r(s, a) on held-out states
(every state of one uniform-random episode per evaluation task: the seed workflow, then the
workflows random edits lead to; every listed child evaluated once and cached): a low-variance
view of the same policies. *duplicates*: steps into a workflow the tree held. *moved*: mean
total variation on those states between a trained policy and the one it started from, and, per
GiGPO iteration, the range of approx_kl, the clip fraction and the exact KL of the update
(``policy/update_kl``). *calibration*: Spearman's rank correlation between the V(s) the
trained policy read at each step of its fused searches and the gain the search realised below
s from that step on (max(0, best score added in s's subtree - s's score),
:func:`aflowrl.rl.yardstick.gains_below`): pooled over all steps, and within episodes.

**state-TV**: the mean total variation between the GiGPO policy's distributions at two held-out
states that list the same candidates, averaged over seeds: 0 for a policy that reads only the
candidate list. **shuffle**: every state's listing is permuted in the observation text together
with the candidates; the check is ok when the distribution follows the actions' content (TV to
the permuted distribution) at most half as far as it follows their positions.

**Where the time goes** (printed as "time per phase", wall and CPU seconds of the bench and all
its services, :func:`tree_cpu_seconds`). The environment replicas take about 72 % of the CPU
(the surrogate executor and the workflow runtime evaluating new workflows, spread over many
small functions and asyncio's scheduling), the rollout 14 % (the policy scoring each state's
prompt with its 9 actions and 10 value replies), the learner 11 %, the bench itself 2-3 %.
Playing a trained policy is the dearest unit: its searches reach workflows nobody evaluated
before, and those the policies prefer (ensembles, fan-outs) make more executor calls.
Measured per unit (``--seeds 0 1 --eval-tasks 3 --iterations 2 --warm-episodes 8
--greedy-tasks 2 --state-steps 1``: 997 s wall, 999 s CPU on 2 cores shared with other runs),
in CPU seconds: starting the services 12; a held-out state 0.75; one (task, seed) cell of
random 1.7, of the warm start 9.5, of GiGPO 8.9 and of GiGPO with UCB 2.2 (most of its
workflows already cached); expected-greedy 3.4 per evaluation task and fit task (a
deterministic policy: its later seeds replay cached episodes); a warm-start episode 4.9; a
GiGPO iteration 35. With S seeds, E evaluation tasks per benchmark (5E tasks with mbpp's),
G greedy fit tasks, I iterations, W warm-start episodes and t state steps, the CPU is about::

    20 + 3 E t + 111 S E + 13.6 E G + S (4.9 W + 35 I)  seconds

Checked on another size (``--seeds 0 --eval-tasks 4 --iterations 2 --warm-episodes 8
--greedy-tasks 3 --state-steps 2``): the formula says 760 s, the run took 795 s of CPU in 662 s
(1.2 cores busy on the shared machine): one seed's plays miss the cache a second seed would
find (the warm start 11.3 s a cell, GiGPO with UCB 3.6), expected-greedy grows slower than E G.
The defaults before (S 3, E 12, G 8, I 8, W 40, t 3) come to about 6,900 s of CPU: 68 minutes
on 2 idle cores at the 1.7 cores the services kept busy in the small profile run on a quiet
machine (366 s of CPU in 218 s), 88 at 1.3. **What was cut to fit 45 minutes**: the
evaluation, not the training (I and W were chosen on tuning tasks; I 12 since 2026-11-29, by
``--split tuning --seeds 0 1 2 --eval-tasks 4 --try-iterations 12 16``, docs/results/learning.md):
2 seeds instead of 3, 7 evaluation tasks per benchmark instead of 12 and 6 greedy fit tasks
instead of 8, so 20 + 63 + 1,554 + 571 + 1,232 = about 3,440 s of CPU: 34 minutes at 1.7
cores, 38 at 1.5, 44 at 1.3.
The ablations (grpo, equal budget), the oracle's own search and the constant and uniform-new
rows stay off (they cost more than the rest together and no verdict reads them), one episode
per (task, seed). The SE stays honest with fewer units because its units are disjoint problem
sets and seeds, whatever their number: it only gets wider (about 1.6 times the 3-seed,
12-task one).

**What values could add (``--value-ceiling``, off by default; it replaces the bench's run)**:
the random proposer on the evaluation tasks of the training benchmarks, once with UCB
selection and once per kind and scale with ``fused`` selection on *oracle* values V*(s)
(:class:`OracleValuer`): every workflow s of a search is reset as a search of its own, every
listed action's child scored on executor sample 1 (as the cross-fitted oracle), and V*(s) sent
for s and for the child the next step makes before that step's parent selection
(``--ceiling-kinds``: ``expected``, the proposer's mean max(0, child - s); ``best``, the best
such gain; ``greedy``, the proposer's mean gain over the tree's best score, which is what a
one-step-greedy selection maximises; ``greedy-same``, the same on sample 0, the scores the
search is paid on: not cross-fitted, a bound no value can reach). ``--ceiling-scales`` (1, 4,
1000) send V* times that, V's weight 0.5, 0.8 and 0.999 at ``fusedW`` 0.5. Each row is paired
with UCB by (task, seed), with the same draws, and the table gives the leads, their SE and z,
the Spearman calibration of V* against the gain realised below s (the trained policy's values:
+0.24) and, for the largest lead short of +2 SE, how many more units +2 SE would need.

**What transfer could reach (``--transfer-ceiling``, off by default; it replaces the bench's
run)**: on the held-out benchmark's evaluation tasks (the test-split chunks of the transfer
figure; same steps, seeds and UCB selection), ``random`` against policies that know more of
that benchmark than a policy trained elsewhere can: ``expected-greedy (mbpp)``, fitted on
``--greedy-tasks`` of its own training-pool tasks, and ``oracle (mbpp)``, the cross-fitted
one-step oracle (``--transfer-rows`` picks them). Each lead over random is paired by (task,
seed) with the bench's bootstrap, with the (unit, seed) cells +2 SE would need at that lead
(:func:`cells_for`).

The last line is (one line)::

    learning: gigpo-start=+X.X SE gigpo-greedy=+Y.Y SE fused-ucb=+Z.Z SE transfer=+W.W SE
        learnable-share=0.NN shuffle=ok

gigpo-start: GiGPO's paired best-gain lead over the warm start it started from; gigpo-greedy:
its lead over expected-greedy; fused-ucb: the same policy with fused selection against UCB;
all on the 28 evaluation tasks of the training benchmarks; transfer: GiGPO against random on
the held-out benchmark's tasks, paired; learnable-share as above.

    python bench/learning.py [--seeds 0 1] [--iterations N] [--steps 10] \\
        [--split eval|tuning] [--data-dir DIR] [--keep DIR] [--methods gigpo grpo equal-budget]
    python bench/learning.py --value-ceiling [--seeds 0 1] [--eval-tasks 6] [--data-dir DIR]
    python bench/learning.py --transfer-ceiling [--seeds 0 1] [--eval-tasks 14] [--data-dir DIR]

Seeds can run apart (one machine each) and be read together: each run ``--dump FILE``, then
``--seeds`` listing them all ``--from-dump FILE...`` prints the tables and the final line of one
run of every seed (the held-out states and the references' fits do not depend on the seed).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import math
import os
import pickle
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from aflowrl._proto.v1 import environment_pb2, rollout_pb2
from aflowrl.benchmarks import get_benchmark
from aflowrl.config import RunSpec
from aflowrl.config.environment import WITH_TEST_SPLIT, PoolName
from aflowrl.envsvc.blob import StateCodec
from aflowrl.executor.surrogate import SurrogateExecutor
from aflowrl.local.launcher import local_services, local_spec
from aflowrl.rl.yardstick import (
    distinct_outcomes,
    gains_below,
    learnable_share,
    spearman,
    two_way_bootstrap,
)
from aflowrl.search import SearchContext, encoding
from aflowrl.search.state import problems_digest
from aflowrl.trainer import app
from aflowrl.trainer.acting import (
    Actor,
    Draw,
    IndexActor,
    UniformActor,
    action_log_probs,
    prompt_of,
)
from aflowrl.trainer.clients import EnvironmentClient, LearnerClient, RolloutClient
from aflowrl.trainer.collect import PROBLEM_POOLS
from aflowrl.trainer.evaluate import evaluate_policy, play_episodes, policy_actor
from aflowrl.trainer.rows import Decision, Episode, Observed
from aflowrl.trainer.state import CheckpointIndex
from aflowrl.trainer.tasks import Task, held_out_tasks, test_pool_tasks
from aflowrl.trainer.values import ValueTable
from aflowrl.trainer.weight_sync import make_weight_sync
from aflowrl.workflow import Evaluator

TRAIN = ("gsm8k", "math", "hotpotqa", "drop")
HELD_OUT = ("mbpp",)
STATES_AT_ONCE = 8
"""States whose every listed action the references evaluate at once."""
STATES_SEED = 77
"""Seed of the uniform-random episodes whose states are the held-out states."""
LISTED = 9
"""Admissible actions listed per observation."""
POOLS = {"heldOut": 0.3, "tuning": 0.2}
SPLIT_POOL = {"eval": "held_out", "tuning": "tuning"}
SPLIT_SEED = {"eval": 10_007, "tuning": 20_011}
"""Task-seed namespaces of the evaluation tasks of each split."""

SPEC = """
policy: {{model: {preset}, dtype: float32, value: {{lossCoef: {value_coef}}}}}
learner:
  fsdp: {{mixedPrecision: none}}
  optimizer: {{lr: {lr}}}
  loss: {{miniBatchSize: {mini_batch}, microBatchSize: {micro_batch}, epochs: {epochs},
    klCoef: {kl_coef}, klEstimator: exact}}
  algorithm: {{type: gigpo, mode: {mode}, siblingStepGroups: {siblings}, stepAdvantageW: {step_w}}}
environment:
  benchmarks: {train}
  heldOutBenchmarks: {held_out}
  data: {{dir: {data_dir}}}
  executor: {{type: surrogate}}
  replicas: {{min: 2, max: 2}}
  evaluation: {{maxProblems: {problems}, repeats: 1, pools: {{heldOut: {held}, tuning: {tuning}}}}}
  search:
    maxSteps: {steps}
    maxAdmissibleActions: {listed}
    maxObservationChars: {obs_chars}
    failedExamples: {failed}
    listDuplicates: {list_duplicates}
    reward: {reward}
    describeOperators: false
    selection: fused
    valueSource: policy
    ucbC: {ucb_c}
trainer:
  iterations: {iterations}
  tasksPerIteration: {tasks_per_iteration}
  groupSize: {group_size}
  checkpointEvery: 0
  finalTestEval: false
  warmStart: {{episodes: {warm}, temperature: {tau}, epochs: {warm_epochs}, lr: {warm_lr},
    valueLossCoef: {warm_value_coef}}}
"""


def make_spec(args: argparse.Namespace, *, steps: int | None = None, **trainer: Any) -> RunSpec:
    """The bench's run spec (module docstring): episodes of ``steps`` (default ``--steps``),
    ``trainer`` fields overridden."""
    text = SPEC.format(
        preset=args.preset,
        value_coef=args.value_coef,
        lr=args.lr,
        mini_batch=args.mini_batch,
        micro_batch=min(args.mini_batch, 8),
        epochs=args.epochs,
        kl_coef=args.kl_coef,
        mode=args.mode,
        siblings="true" if args.siblings else "false",
        step_w=args.step_w,
        train=list(TRAIN),
        held_out=list(HELD_OUT),
        data_dir=args.data_dir,
        problems=args.problems,
        held=POOLS["heldOut"],
        tuning=POOLS["tuning"],
        steps=steps or args.steps,
        listed=LISTED,
        obs_chars=args.observation_chars,
        failed=args.failed_examples,
        list_duplicates="true" if args.list_duplicates else "false",
        reward=args.reward,
        ucb_c=args.ucb_c,
        iterations=args.iterations,
        tasks_per_iteration=args.tasks_per_iteration,
        group_size=args.group_size,
        warm=args.warm_episodes,
        tau=args.tau,
        warm_epochs=args.warm_epochs,
        warm_lr=args.warm_lr,
        warm_value_coef=args.warm_value_coef,
    )
    spec = RunSpec.from_yaml(text, source="bench/learning.py")
    doc = spec.to_document()
    doc["trainer"].update(trainer)
    return RunSpec.from_document(doc)


def with_steps(spec: RunSpec, steps: int) -> RunSpec:
    """``spec`` with episodes of ``steps`` edits (to play, not to train: the mini-batch is cut
    to the rows of one iteration where the episodes got shorter)."""
    doc = spec.to_document()
    doc["environment"]["search"]["maxSteps"] = steps
    loss = doc["learner"]["loss"]
    rows = spec.trainer.tasks_per_iteration * spec.trainer.group_size * steps
    loss["miniBatchSize"] = min(loss["miniBatchSize"], rows)
    loss["microBatchSize"] = min(loss["microBatchSize"], loss["miniBatchSize"])
    return RunSpec.from_document(doc)


# ---- statistics -------------------------------------------------------------------------------


@dataclass
class Cells:
    """One figure per (task, seed) cell: a mean over that cell's values."""

    values: dict[tuple[Any, int], list[float]] = field(default_factory=dict)

    def add(self, task: Any, seed: int, value: float) -> None:
        self.values.setdefault((task, seed), []).append(value)

    def matrix(self, tasks: Sequence[Any], seeds: Sequence[int]) -> np.ndarray:
        """[tasks, seeds] of cell means (every cell must exist)."""
        return np.array(
            [[statistics.fmean(self.values[t, s]) for s in seeds] for t in tasks],
            dtype=np.float64,
        )


@dataclass
class Figure:
    mean: float
    se: float

    def __str__(self) -> str:
        return f"{self.mean:+.4f} ± {self.se:.4f}"

    @property
    def z(self) -> float:
        if self.se > 0:
            return self.mean / self.se
        return 0.0 if self.mean == 0 else math.copysign(math.inf, self.mean)


# ---- reference actors (the bench's own: they look the state up) ---------------------------


class UniformNewActor(Actor):
    """Uniform over the listed actions that lead to a workflow the tree does not hold."""

    async def act(self, observed: Sequence[Observed], *, draws: Sequence[Draw]) -> list[Decision]:
        out = []
        for o, draw in zip(observed, draws, strict=True):
            new = [k for k, node in enumerate(o.in_tree) if node < 0] or list(
                range(len(o.admissible))
            )
            k = new[int(draw.rng.integers(len(new)))]
            out.append(Decision(action=encoding.action_reply(o.admissible[k])))
        return out


class RecordingActor(UniformActor):
    """Uniform over the listed actions; keeps every observation it decided on."""

    def __init__(self) -> None:
        self.seen: list[Observed] = []

    async def act(self, observed: Sequence[Observed], *, draws: Sequence[Draw]) -> list[Decision]:
        self.seen.extend(observed)
        return await super().act(observed, draws=draws)


class SecondReading:
    """Workflows scored on a task's problems on executor sample 1; the search reads sample 0
    (the same workflow and problems, an independent run of the executor), so a choice made on
    sample 1 and scored on sample 0 is cross-fitted. The task's problems are those the
    environment draws (the same code, :meth:`SearchContext.episode_problems`, on the same
    files), checked against the digest in the episode's state."""

    def __init__(self, env: EnvironmentClient, spec: RunSpec, data_dir: str) -> None:
        self.env = env
        self.evaluation = spec.environment.evaluation
        self.codec = StateCodec()
        self.contexts: dict[str, SearchContext] = {}
        for name in (*TRAIN, *HELD_OUT):
            benchmark = get_benchmark(name)
            pool = benchmark.load(self.evaluation.split, data_dir)
            test = benchmark.load("test", data_dir) if name in WITH_TEST_SPLIT else []
            self.contexts[name] = SearchContext(
                Evaluator(SurrogateExecutor(pool), benchmark),
                pool,
                evaluation=self.evaluation,
                test_problems=test,
            )
        self._problems: dict[tuple[str, int, str], list[str]] = {}
        self.slots = asyncio.Semaphore(STATES_AT_ONCE)

    def problem_ids(self, o: Observed) -> list[str]:
        key = (o.benchmark, o.seed, o.pool)
        if key not in self._problems:
            problems = self.contexts[o.benchmark].episode_problems(
                o.seed, self.evaluation.max_problems, o.pool
            )
            state = self.codec.decode(o.state, field="state")
            if problems_digest(problems) != state.problems:
                raise RuntimeError(f"the problems of {key} differ from the environment's")
            self._problems[key] = [p.problem_id for p in problems]
        return self._problems[key]

    async def outcomes(
        self, o: Observed, workflows: Sequence[str], keys: Sequence[str]
    ) -> list[list[tuple[float, float]]]:
        """Per workflow, its (sample 0, sample 1) score on each of the task's problems (routed
        by ``keys``: a child's hash, where its Step left sample 0 in the cache)."""
        ids = self.problem_ids(o)
        split = "test" if o.pool == "test" else self.evaluation.split
        replies = await asyncio.gather(
            *(
                self.env.evaluate(
                    environment_pb2.EvaluateRequest(
                        workflow_json=w,
                        benchmark=o.benchmark,
                        split=split,
                        problem_ids=ids,
                        repeats=2,
                        seed=0,
                    ),
                    key=key,
                )
                for w, key in zip(workflows, keys, strict=True)
            )
        )
        return [[(p.scores[0], p.scores[1]) for p in r.problems] for r in replies]


@dataclass(frozen=True)
class Readings:
    """Every listed action of one state: its reward (sample 0, what the search pays), its
    child's score on samples 0 and 1, and the child's outcome on each problem and sample."""

    rewards: tuple[float, ...]
    first: tuple[float, ...]
    second: tuple[float, ...]
    outcomes: tuple[tuple[tuple[float, float], ...], ...]

    @property
    def cross_fitted(self) -> int:
        """The action whose child scores best on sample 1 (ties: the earliest)."""
        return int(np.argmax(self.second))

    @property
    def distinct(self) -> int:
        return distinct_outcomes(self.outcomes)


async def readings(env: EnvironmentClient, second: SecondReading, o: Observed) -> Readings:
    """Step every listed action of ``o`` and score each child on sample 1 too (a few states
    at a time: a burst of thousands of calls outlasts the environment's 60 s Project deadline
    on a busy machine)."""
    async with second.slots:
        return await _readings(env, second, o)


async def _readings(env: EnvironmentClient, second: SecondReading, o: Observed) -> Readings:
    replies = await asyncio.gather(
        *(
            env.step(
                o.state,
                encoding.action_reply(a),
                episode_key=o.anchor,
                values=environment_pb2.StateValues(),
            )
            for a in o.admissible
        )
    )
    children = [reply.info.child_workflow_json or o.workflow_json for reply, _ in replies]
    keys = [reply.info.child_hash or o.anchor for reply, _ in replies]
    outcomes = await second.outcomes(o, children, keys)
    first = [statistics.fmean(a for a, _ in v) for v in outcomes]
    for (reply, _), score in zip(replies, first, strict=True):
        if reply.info.child_workflow_json and abs(reply.info.child_score - score) > 1e-9:
            raise RuntimeError(
                f"sample 0 of a child scores {score} here and {reply.info.child_score} in the "
                "search: not the episode's problems"
            )
    return Readings(
        rewards=tuple(float(reply.reward) for reply, _ in replies),
        first=tuple(first),
        second=tuple(statistics.fmean(b for _, b in v) for v in outcomes),
        outcomes=tuple(tuple(v) for v in outcomes),
    )


class OracleActor(Actor):
    """The cross-fitted one-step oracle: evaluates every listed action on the task itself and
    takes the one whose child scores best on executor sample 1, while the search pays its
    reward on sample 0 (choosing and scoring on one sample would count the executor's noise
    as skill: bench/reward_noise.py)."""

    def __init__(self, env: EnvironmentClient, second: SecondReading) -> None:
        self.env = env
        self.second = second

    async def act(self, observed: Sequence[Observed], *, draws: Sequence[Draw]) -> list[Decision]:
        async def one(o: Observed) -> Decision:
            found = await readings(self.env, self.second, o)
            return Decision(action=encoding.action_reply(o.admissible[found.cross_fitted]))

        return list(await asyncio.gather(*(one(o) for o in observed)))


class GreedyActor(Actor):
    """Expected-greedy: the listed action with the best mean one-step reward over training-pool
    tasks of the benchmark started from the same workflow (a duplicate is worth minus the
    duplicate penalty, as on the task itself); fitted lazily, per (benchmark, workflow)."""

    def __init__(
        self, env: EnvironmentClient, spec: RunSpec, fit_tasks: dict[str, list[Task]]
    ) -> None:
        self.env = env
        self.spec = spec
        self.fit_tasks = fit_tasks
        self.table: dict[tuple[str, str], dict[str, float]] = {}
        self.fits: list[tuple[float, float]] = []
        self.slots = asyncio.Semaphore(STATES_AT_ONCE)
        """Per fitted state: the SE of the best action's mean reward over the fit tasks, and
        its lead over the second best."""
        self._fitting: dict[tuple[str, str], asyncio.Future[dict[str, float]]] = {}

    async def means(self, benchmark: str, anchor: str, workflow_json: str) -> dict[str, float]:
        """Mean reward per action text of ``workflow_json`` over the fit tasks."""
        key = (benchmark, anchor)
        if key in self.table:
            return self.table[key]
        if key not in self._fitting:
            self._fitting[key] = asyncio.ensure_future(self._fit(benchmark, workflow_json, anchor))
        means = await self._fitting[key]
        self.table[key] = means
        return means

    async def _fit(self, benchmark: str, workflow_json: str, anchor: str) -> dict[str, float]:
        rewards: dict[str, list[float]] = {}

        async def one(task: Task) -> None:
            async with self.slots:
                await fit_one(task)

        async def fit_one(task: Task) -> None:
            reply = await reset(self.env, self.spec, task, workflow_json, key=anchor)
            actions = list(reply.observation.admissible_actions)
            values = await step_rewards(self.env, reply.state, actions, key=task.benchmark)
            for action, value in zip(actions, values, strict=True):
                rewards.setdefault(action, []).append(value)

        await asyncio.gather(*(one(t) for t in self.fit_tasks[benchmark]))
        means = {a: statistics.fmean(v) for a, v in rewards.items()}
        ranked = sorted(means, key=lambda a: -means[a])
        if len(ranked) > 1 and len(rewards[ranked[0]]) > 1:
            best = rewards[ranked[0]]
            self.fits.append(
                (
                    statistics.stdev(best) / math.sqrt(len(best)),
                    means[ranked[0]] - means[ranked[1]],
                )
            )
        return means

    def choose(self, o: Observed, means: dict[str, float]) -> int:
        penalty = self.spec.environment.search.duplicate_penalty
        values = [
            -penalty if node >= 0 else means.get(action, -math.inf)
            for action, node in zip(
                o.admissible, o.in_tree or [-1] * len(o.admissible), strict=True
            )
        ]
        return int(np.argmax(values))

    async def act(self, observed: Sequence[Observed], *, draws: Sequence[Draw]) -> list[Decision]:
        async def one(o: Observed) -> Decision:
            means = await self.means(o.benchmark, o.anchor, o.workflow_json)
            return Decision(action=encoding.action_reply(o.admissible[self.choose(o, means)]))

        return list(await asyncio.gather(*(one(o) for o in observed)))


class ScaledValues(ValueTable):
    """The policy's values, sent multiplied by ``scale``: fused selection's score
    (1 - w) UCB + w V then ranks as (1 - w') UCB + w' V with w' / (1 - w') = scale w / (1 - w),
    another ``search.fusedW`` without restarting the environment (scale 0: UCB alone)."""

    def __init__(self, scale: float) -> None:
        super().__init__("policy")
        self.scale = scale

    def proto(self, own: Any = None) -> environment_pb2.StateValues:
        sent = super().proto(own)
        return environment_pb2.StateValues(
            values={a: v * self.scale for a, v in sent.values.items()},
            default_value=sent.default_value * self.scale,
        )


# ---- oracle values (--value-ceiling) -------------------------------------------------------


def one_step_values(
    parent: float, children: Sequence[float], pi: Sequence[float]
) -> tuple[float, float]:
    """Oracle values of a workflow s from one executor sample: ``parent`` is s's score on it,
    ``children`` the scores of the children its listed actions make, ``pi`` the proposer's
    probabilities of those actions. Returns (the proposer's expected one-step gain
    sum_a pi(a) max(0, child_a - parent), the best one-step gain max_a max(0, child_a - parent)):
    the improvement reward of a search that holds s alone; (0, 0) when nothing is listed."""
    if len(children) != len(pi):
        raise ValueError(f"{len(pi)} probabilities for {len(children)} children")
    if not children:
        return 0.0, 0.0
    gains = [max(0.0, child - parent) for child in children]
    return math.fsum(p * g for p, g in zip(pi, gains, strict=True)), max(gains)


ORACLE_KINDS = ("expected", "best", "greedy", "greedy-same")
"""The oracle values --value-ceiling can send (:meth:`OracleValue.of`)."""


@dataclass(frozen=True)
class OracleValue:
    """What a one-step oracle knows of one workflow s of one task: its score and its listed
    children's on executor sample 1 (and on sample 0, the scores the search reads)."""

    parent: float
    children: tuple[float, ...]
    parent_same: float = 0.0
    children_same: tuple[float, ...] = ()

    def of(self, kind: str, best_so_far: float = -math.inf) -> float:
        """V*(s) of ``kind`` (:func:`one_step_values`, pi uniform: the random proposer):
        "expected", the proposer's expected one-step gain over s; "best", the best one-step
        gain over s; "greedy", the proposer's expected one-step gain over the best score
        ``best_so_far`` of the tree (on sample 1): how much expanding s is expected to raise
        the search's best, what a one-step-greedy parent selection maximises; "greedy-same",
        the same on sample 0, the scores the search itself reads (not cross-fitted: it knows
        the executor's noise in the search's own scores, a bound no value can reach;
        ``best_so_far`` then on sample 0)."""
        pi = [1.0 / len(self.children)] * len(self.children) if self.children else []
        if kind == "greedy":
            return one_step_values(max(self.parent, best_so_far), self.children, pi)[0]
        if kind == "greedy-same":
            bar = max(self.parent_same, best_so_far)
            return one_step_values(bar, self.children_same, pi)[0]
        expected, best = one_step_values(self.parent, self.children, pi)
        return {"expected": expected, "best": best}[kind]


class OracleValuer:
    """V*(s) of a task's workflow s, cross-fitted: s is reset as a search of the task of its
    own (listing every action but those leading back to s), every listed child is scored on
    executor sample 1 (:func:`readings`) and so is s (:class:`OracleValue`). The search pays
    on sample 0: V* knows what expanding s is worth on the task's problems, nothing of the
    noise of the scores the search reads. Cached per (task, workflow)."""

    def __init__(self, env: EnvironmentClient, spec: RunSpec, second: SecondReading) -> None:
        self.env = env
        self.spec = spec
        self.second = second
        self.known: dict[tuple[str, int, str, str], asyncio.Future[OracleValue]] = {}

    async def value(self, o: Observed, anchor: str, workflow_json: str) -> OracleValue:
        """V* of workflow ``anchor`` (``workflow_json``) on the task of ``o``."""
        key = (o.benchmark, o.seed, o.pool, anchor)
        if key not in self.known:
            task = Task(o.benchmark, o.seed, o.pool)  # type: ignore[arg-type]
            self.known[key] = asyncio.ensure_future(self._value(task, anchor, workflow_json))
        return await self.known[key]

    def cached(self, task: Task, anchor: str) -> OracleValue:
        """V* of ``anchor`` on ``task``, already computed."""
        return self.known[task.benchmark, task.seed, task.pool, anchor].result()

    async def _value(self, task: Task, anchor: str, workflow_json: str) -> OracleValue:
        reply = await reset(self.env, self.spec, task, workflow_json, key=anchor)
        if reply.observation.anchor != anchor:
            raise RuntimeError(f"workflow {anchor[:12]} resets as {reply.observation.anchor[:12]}")
        root = Observed(
            reply.observation.text,
            tuple(reply.observation.admissible_actions),
            benchmark=task.benchmark,
            anchor=anchor,
            workflow_json=workflow_json,
            state=reply.state,
            seed=task.seed,
            pool=task.pool,
        )
        found, (own,) = await asyncio.gather(
            readings(self.env, self.second, root),
            self.second.outcomes(root, [workflow_json], [anchor]),
        )
        return OracleValue(
            statistics.fmean(b for _, b in own),
            found.second,
            statistics.fmean(a for a, _ in own),
            found.first,
        )


class OracleTable(ValueTable):
    """One search's oracle values: V*(s) of ``kind`` per anchor, sent times ``scale`` (another
    ``search.fusedW``, as :class:`ScaledValues`). The collector sends the live table, not a
    snapshot, so what :class:`OracleValuedActor` adds before a Step reaches that Step's parent
    selection; "greedy" values are computed at each request against the best sample-1 score
    of the workflows added so far (on sample 0 for "greedy-same")."""

    def __init__(self, kind: str, scale: float) -> None:
        super().__init__("policy")
        self.kind = kind
        self.scale = scale
        self.known: dict[str, OracleValue] = {}

    def add(self, anchor: str, value: OracleValue) -> None:
        self.known[anchor] = value

    @property
    def best_so_far(self) -> float:
        """The best score of the workflows added so far, on the sample ``kind`` reads."""
        same = self.kind == "greedy-same"
        return max(
            (v.parent_same if same else v.parent for v in self.known.values()), default=-math.inf
        )

    def value(self, anchor: str) -> float:
        return self.known[anchor].of(self.kind, self.best_so_far)

    def snapshot(self) -> ValueTable:
        return self

    def proto(self, own: Any = None) -> environment_pb2.StateValues:
        best = self.best_so_far
        return environment_pb2.StateValues(
            values={a: v.of(self.kind, best) * self.scale for a, v in self.known.items()},
            default_value=0.0,
        )


class OracleValuedActor(Actor):
    """``proposer``'s decisions, each carrying V*(s) (``kind``) of the workflow it modifies as
    its value (read by the calibration); with ``table`` (one search's), V* of that workflow
    and of the child the action makes go into the table before the Step, so fused selection
    reads an oracle value at every node of the tree (a child the table lacked would take its
    parent's)."""

    def __init__(
        self, proposer: Actor, valuer: OracleValuer, kind: str, table: OracleTable | None
    ) -> None:
        self.proposer = proposer
        self.valuer = valuer
        self.kind = kind
        self.table = table

    async def act(self, observed: Sequence[Observed], *, draws: Sequence[Draw]) -> list[Decision]:
        decisions = await self.proposer.act(observed, draws=draws)
        return list(
            await asyncio.gather(
                *(self._valued(o, d) for o, d in zip(observed, decisions, strict=True))
            )
        )

    async def _valued(self, o: Observed, decision: Decision) -> Decision:
        own = await self.valuer.value(o, o.anchor, o.workflow_json)
        if self.table is None:
            return dataclasses.replace(decision, value=own.of(self.kind))
        self.table.add(o.anchor, own)
        read = self.table.value(o.anchor)
        reply, _ = await self.valuer.env.step(
            o.state, decision.action, episode_key=o.anchor, values=environment_pb2.StateValues()
        )
        info = reply.info
        if info.valid_action and info.child_hash and not info.duplicate:
            child = await self.valuer.value(o, info.child_hash, info.child_workflow_json)
            self.table.add(info.child_hash, child)
        return dataclasses.replace(decision, value=read)


def effective_weight(w: float, scale: float) -> float:
    """The weight of V in the fused score when values are sent times ``scale`` at
    ``search.fusedW`` ``w`` (:class:`ScaledValues`)."""
    if w >= 1.0:
        return 1.0
    ratio = scale * w / (1.0 - w)
    return ratio / (1.0 + ratio)


async def reset(
    env: EnvironmentClient, spec: RunSpec, task: Task, workflow_json: str, *, key: str
) -> environment_pb2.ResetResponse:
    """An episode of ``task`` started from ``workflow_json`` (routed by ``key``, its hash)."""
    return await env.reset(
        environment_pb2.ResetRequest(
            task=task.benchmark,
            seed=task.seed,
            max_steps=spec.environment.search.max_steps,
            seed_workflow_json=workflow_json,
            problem_pool=PROBLEM_POOLS[task.pool],
            values=environment_pb2.StateValues(),
        ),
        key=key,
    )


async def step_rewards(
    env: EnvironmentClient, state: bytes, actions: Sequence[str], *, key: str
) -> list[float]:
    """The one-step reward of every action from ``state``."""
    replies = await asyncio.gather(
        *(
            env.step(
                state,
                encoding.action_reply(a),
                episode_key=key,
                values=environment_pb2.StateValues(),
            )
            for a in actions
        )
    )
    return [float(reply.reward) for reply, _ in replies]


# ---- held-out states ----------------------------------------------------------------------


@dataclass(frozen=True)
class State:
    """A held-out state with the readings of every listed action."""

    task: Task
    text: str
    actions: tuple[str, ...]
    readings: Readings
    observed: Observed

    @property
    def rewards(self) -> tuple[float, ...]:
        return self.readings.rewards

    @property
    def benchmark(self) -> str:
        return self.task.benchmark


def permuted_text(text: str, actions: Sequence[str], order: Sequence[int]) -> str:
    """``text`` with its listing of ``actions`` reordered as ``order`` (``actions[order[i]]``
    listed i-th)."""
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("## Admissible actions")) + 1
    block = lines[start : start + len(actions)]
    for line, action in zip(block, actions, strict=True):
        if not line.startswith(f"- {action}"):
            raise ValueError(f"listing line {line[:60]!r} is not action {action[:60]!r}")
    lines[start : start + len(actions)] = [block[k] for k in order]
    return "\n".join(lines)


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
    return 0.5 * float(np.abs(p - q).sum())


def tree_cpu_seconds(root: int | None = None) -> float:
    """CPU seconds (user + system) of process ``root`` (this one by default) and every live
    process below it, with the children they have reaped (the services, their sandbox and
    sympy workers); NaN where ``/proc`` cannot be read (not Linux)."""
    root = os.getpid() if root is None else root
    ticks = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    used: dict[int, int] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return math.nan
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
        except OSError:  # ended meanwhile
            continue
        fields = text[text.rindex(")") + 2 :].split()
        # after the name: state ppid ... utime(14) stime cutime cstime (1-based in proc(5))
        parent[int(entry)] = int(fields[1])
        used[int(entry)] = sum(int(v) for v in fields[11:15])
    below = {root}
    grew = True
    while grew:
        grew = False
        for pid, ppid in parent.items():
            if ppid in below and pid not in below:
                below.add(pid)
                grew = True
    return sum(used.get(pid, 0) for pid in below) / ticks


# ---- the bench ------------------------------------------------------------------------------


@dataclass
class Method:
    """One row of the tables."""

    name: str
    gain: Cells = field(default_factory=Cells)
    onestep: Cells = field(default_factory=Cells)
    duplicates: list[float] = field(default_factory=list)
    evaluations: list[float] = field(default_factory=list)
    """Workflow evaluations its training needed, per seed."""
    executor_calls: list[float] = field(default_factory=list)
    moved: list[float] = field(default_factory=list)
    """TV on the held-out states from the policy it started from, per seed."""
    updates: list[dict[str, float]] = field(default_factory=list)
    """GiGPO/GRPO: per iteration, the update's statistics (all seeds)."""
    seconds: float = 0.0
    calibration: list[tuple[list[float], list[float]]] = field(default_factory=list)
    """Per episode played with values: V(s) at each step and the gain realised below s."""


def evaluation_tasks(
    benchmarks: Sequence[str], count: int, split: str, namespace: int, pool: Any
) -> list[Task]:
    """``count`` tasks per benchmark: with ``--split eval``, consecutive task seeds in the test
    pool (disjoint chunks of the test split: no problem in two tasks, none in a training or
    tuning task) for the benchmarks with a test split
    (:data:`~aflowrl.config.environment.WITH_TEST_SPLIT`; HotpotQA has none); otherwise tasks
    of ``pool``."""
    tasks: list[Task] = []
    for name in benchmarks:
        if split == "eval" and name in WITH_TEST_SPLIT:
            tasks += test_pool_tasks(name, count, start=namespace)
        else:
            tasks += held_out_tasks([name], count, seed=namespace, pool=pool)
    return tasks


def bootstrap_unit(task: Task) -> tuple[Any, ...]:
    """The bootstrap's unit of ``task``: a test-split task alone (its problems are in no other
    task), the tasks of a benchmark without a test split together (they share problems)."""
    return (task.benchmark, task.seed) if task.pool == "test" else (task.benchmark,)


def realised_below(episode: Episode) -> list[float]:
    """Per step of ``episode``, the gain its search realised below the workflow the step
    modified (:func:`aflowrl.rl.yardstick.gains_below`)."""
    rows = episode.rows
    return gains_below(
        [r.anchor for r in rows],
        [r.child_hash if r.valid and not r.duplicate else None for r in rows],
        [r.child_score for r in rows],
        [r.parent_score for r in rows],
    )


TRANSFER_GREEDY = "expected-greedy (mbpp)"
TRANSFER_ORACLE = "oracle (mbpp)"
"""The --transfer-ceiling rows paired with random: expected-greedy fitted on the held-out
benchmark's own training-pool tasks, and the cross-fitted one-step oracle."""

CEILING_UCB = "random (ucb)"
"""The --value-ceiling row every oracle-valued search is paired with."""


def ceiling_name(kind: str, scale: float, w: float) -> str:
    """The --value-ceiling row of fused selection on V* ``kind`` sent times ``scale``."""
    return f"random (fused, V* {kind} x{scale:g}, w {effective_weight(w, scale):.3f})"


class Bench:
    """The services, the tasks and every method's figures (module docstring)."""

    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args = args
        self.root = root
        self.base = local_spec(make_spec(args), root)
        pool = SPLIT_POOL[args.split]
        namespace = SPLIT_SEED[args.split]
        self.tasks = evaluation_tasks(TRAIN, args.eval_tasks, args.split, namespace, pool)
        self.transfer = evaluation_tasks(HELD_OUT, args.eval_tasks, args.split, namespace, pool)
        self.methods: dict[str, Method] = {}
        self.states: list[State] = []
        self.tv: list[float] = []
        self.shuffle: list[tuple[float, float]] = []
        self.start_distribution: dict[int, list[np.ndarray]] = {}
        self.ceiling_calibration: dict[str, list[tuple[list[float], list[float]]]] = {}
        """--value-ceiling: per V* kind, V*(s) and the gain realised below s at each step of
        the UCB searches."""
        self.ceiling_shape: dict[str, tuple[float, float]] = {}
        """--value-ceiling: per row, the workflows its searches modified (mean per search) and
        the share of steps that modified the seed workflow."""
        self.ceiling_values: list[tuple[float, float]] = []
        """--value-ceiling: V* expected and best of every workflow valued."""
        self.phases: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        """Per phase: CPU seconds of the bench and its services (:func:`tree_cpu_seconds`)."""
        self.greedy: GreedyActor | GreedyFits | None = None
        """expected-greedy (its fits, from a --dump)."""

    def method(self, name: str) -> Method:
        return self.methods.setdefault(name, Method(name))

    @staticmethod
    def clock() -> tuple[float, float]:
        """(wall, CPU of the process tree) now: where a phase starts."""
        return time.perf_counter(), tree_cpu_seconds()

    def phase(self, name: str, started: tuple[float, float]) -> None:
        """Add the wall and CPU seconds since ``started`` (:meth:`clock`) to phase ``name``
        (printed at the end)."""
        wall, cpu = self.clock()
        self.phases[name] = self.phases.get(name, 0.0) + wall - started[0]
        self.cpu[name] = self.cpu.get(name, 0.0) + cpu - started[1]

    # ---- services ----

    async def run(self) -> None:
        started = self.clock()
        async with local_services(self.base, self.root, threads_per_service=self.args.threads) as (
            targets,
            _group,
        ):
            self.targets = targets
            self.learner = LearnerClient(targets.learner)
            self.rollout = RolloutClient(targets.rollout)
            self.env = EnvironmentClient(targets.env, step_timeout_s=1800.0)
            self.second = SecondReading(self.env, self.base, self.args.data_dir)
            self.weights = make_weight_sync(self.base, targets.learner, targets.rollout)
            initial = self.root / "initial-policy"
            await self.learner.save(str(initial), b"")
            self.phase("start services", started)
            try:
                if self.args.value_ceiling:
                    await self._value_ceiling()
                    return
                if self.args.transfer_ceiling:
                    await self._transfer_ceiling()
                    return
                await self._states()
                if self.args.references:
                    await self._references()
                for seed in self.args.seeds:
                    await self._seed(seed, initial)
            finally:
                await self.weights.close()
                await self.learner.close()
                await self.rollout.close()
                await self.env.close()

    async def _load(self, path: Path) -> None:
        """Load a learner checkpoint and serve it (versions only increase)."""
        top = max((await self.rollout.versions()).values())
        await self.learner.load(str(path), min_policy_version=top + 1)
        report = await self.weights.push()
        if not report.ok:
            raise RuntimeError(f"the weights did not reach the rollout: {report.failed}")

    async def _train(self, spec: RunSpec, run_dir: Path) -> list[dict[str, Any]]:
        services = app.connect(
            spec, env=self.targets.env, rollout=self.targets.rollout, learner=self.targets.learner
        )
        await app.train(spec, services, run_dir)
        path = run_dir / "metrics.jsonl"
        return (
            [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
        )

    # ---- held-out states and the references ----

    async def _states(self) -> None:
        """The held-out states: every state one uniform-random episode visits on each
        evaluation task (the seed workflow first, then what random edits lead to: the states a
        search meets), with the reward of every listed action from each."""
        started = self.clock()
        recorder = RecordingActor()
        await evaluate_policy(
            with_steps(self.base, self.args.state_steps),
            self.env,
            recorder,
            self.tasks,
            seed=STATES_SEED,
            values=ValueTable.empty(),
        )

        async def one(o: Observed) -> State:
            found = await readings(self.env, self.second, o)
            task = Task(o.benchmark, o.seed, cast("PoolName", o.pool))
            return State(task, o.text, o.admissible, found, o)

        self.states = list(await asyncio.gather(*(one(o) for o in recorder.seen)))
        self.phase("held-out states", started)
        print(
            f"held-out states: {len(self.states)} ({self.phases['held-out states']:.0f} s)",
            flush=True,
        )

    def _record_states(
        self, method: Method, seed: int, choose: Callable[[State], np.ndarray]
    ) -> None:
        """E_{a~pi} r(s, a) on every held-out state, ``choose`` giving pi(. | s)."""
        for state in self.states:
            pi = choose(state)
            method.onestep.add(
                state.task, seed, float(np.dot(pi, np.asarray(state.rewards, dtype=np.float64)))
            )

    async def _play(
        self,
        method: Method,
        actor: Actor,
        seed: int,
        *,
        spec: RunSpec | None = None,
        ucb: bool,
        transfer: bool = True,
        values: ValueTable | None = None,
        tasks: Sequence[Task] | None = None,
    ) -> None:
        """Play ``actor`` on the evaluation tasks (``ucb``: selection by UCB alone, every V the
        same; else ``fused`` on the values the actor reads) and record its best-gains and the
        calibration of the values it read (``tasks``: these instead)."""
        spec = with_steps(spec or self.base, self.args.steps)
        if tasks is None:
            tasks = [*self.tasks, *(self.transfer if transfer else [])]
        started = self.clock()
        played: list[Episode] = await play_episodes(
            spec,
            self.env,
            actor,
            tasks,
            episodes_per_task=self.args.eval_episodes,
            seed=seed,
            values=ValueTable.empty() if ucb else values,
        )
        self._record(method, seed, tasks, played)
        self.phase(f"play {method.name}", started)

    def _record(
        self, method: Method, seed: int, tasks: Sequence[Task], played: Sequence[Episode]
    ) -> None:
        """The best-gains of the episodes ``played`` on ``tasks`` (``--eval-episodes`` each, in
        task order) and the calibration of the values their decisions read."""
        repeated = [t for t in tasks for _ in range(self.args.eval_episodes)]
        steps = duplicates = 0
        for task, episode in zip(repeated, played, strict=True):
            method.gain.add(task, seed, episode.best_gain)
            steps += len(episode.rows)
            duplicates += sum(1 for r in episode.rows if r.valid and r.duplicate)
            rows = episode.rows
            if not rows or any(r.decision.value is None for r in rows):
                continue
            read = [float(r.decision.value or 0.0) for r in rows]
            method.calibration.append((read, realised_below(episode)))
        method.duplicates.append(duplicates / max(1, steps))

    async def _references(self) -> None:
        args = self.args
        greedy_fit = {
            name: [Task(name, 3_000 + k, "training") for k in range(args.greedy_tasks)]
            for name in (*TRAIN, *HELD_OUT)
        }
        greedy = GreedyActor(self.env, self.base, greedy_fit)
        references: list[tuple[str, Actor]] = [("random", UniformActor())]
        constant = 0
        if args.more_references:
            constant = await self._constant()
            self.constant = f"constant (k={constant + 1})"
            references += [
                ("uniform new", UniformNewActor()),
                (self.constant, IndexActor(constant)),
            ]
        references.append(("expected-greedy", greedy))
        if args.more_references:
            references.append(("oracle", OracleActor(self.env, self.second)))
        for name, actor in references:
            method = self.method(name)
            started = time.perf_counter()
            for seed in args.seeds:
                # Fitting expected-greedy at, and reading twice, every state of a code task
                # (mbpp) would cost more than the rest of the references together; the
                # verdicts read them on the training benchmarks only.
                await self._play(method, actor, seed, ucb=True, transfer=name == "random")
            method.seconds = time.perf_counter() - started
            print(f"{name:>28}: played ({method.seconds:.0f} s)", flush=True)
        self.greedy = greedy
        clock = self.clock()
        choice: dict[int, int] = {}
        for state in self.states:
            state_means = await greedy.means(
                state.benchmark, state.observed.anchor, state.observed.workflow_json
            )
            choice[id(state)] = greedy.choose(state.observed, state_means)
        self.phase("fit expected-greedy at the held-out states", clock)

        def one_hot(k: int, n: int) -> np.ndarray:
            out = np.zeros(n)
            out[k] = 1.0
            return out

        rules: dict[str, Callable[[State], np.ndarray]] = {
            "random": lambda s: np.full(len(s.actions), 1.0 / len(s.actions)),
            "expected-greedy": lambda s: one_hot(choice[id(s)], len(s.actions)),
            "oracle": lambda s: one_hot(s.readings.cross_fitted, len(s.actions)),
        }
        if args.more_references:
            rules["uniform new"] = rules["random"]
            rules[self.constant] = lambda s: one_hot(
                min(constant, len(s.actions) - 1), len(s.actions)
            )
        for name, rule in rules.items():
            for seed in args.seeds:
                self._record_states(self.method(name), seed, rule)

    async def _value_ceiling(self) -> None:
        """--value-ceiling: the random proposer on the evaluation tasks of the training
        benchmarks, with UCB selection and with fused selection on oracle values V*(s)
        (:class:`OracleValuer`) at each kind and scale. Every (task, seed) cell is played by
        its own collector (each task its own value table; V* depends on the task's problems),
        with the same draws in every row, so each pairing starts from the same first edit."""
        args = self.args
        if args.eval_episodes != 1:
            raise ValueError("--value-ceiling plays one episode per (task, seed)")
        spec = with_steps(self.base, args.steps)
        w = spec.environment.search.fused_w
        self.ceiling = OracleValuer(self.env, self.base, self.second)
        self.ceiling_played: dict[str, list[tuple[Task, Episode]]] = {}
        rows: list[tuple[str, str, float | None]] = [(CEILING_UCB, "expected", None)] + [
            (ceiling_name(kind, scale, w), kind, scale)
            for kind in args.ceiling_kinds
            for scale in args.ceiling_scales
        ]
        for seed in args.seeds:
            for name, kind, scale in rows:
                started = self.clock()

                async def one(
                    index: int,
                    task: Task,
                    kind: str = kind,
                    scale: float | None = scale,
                    seed: int = seed,
                ) -> list[Episode]:
                    table = None if scale is None else OracleTable(kind, scale)
                    actor = OracleValuedActor(UniformActor(), self.ceiling, kind, table)
                    return await play_episodes(
                        spec,
                        self.env,
                        actor,
                        [task],
                        episodes_per_task=args.eval_episodes,
                        seed=seed * 100_003 + index,
                        values=ValueTable.empty() if table is None else table,
                    )

                played = await asyncio.gather(*(one(i, t) for i, t in enumerate(self.tasks)))
                episodes = [e for cell in played for e in cell]
                self._record(self.method(name), seed, self.tasks, episodes)
                repeated = [t for t in self.tasks for _ in range(args.eval_episodes)]
                self.ceiling_played.setdefault(name, []).extend(
                    zip(repeated, episodes, strict=True)
                )
                self.phase(f"play {name}", started)
                gains = [e.best_gain for e in episodes]
                print(
                    f"{name:>44} seed {seed}: best-gain {statistics.fmean(gains):+.4f} "
                    f"({self.phases[f'play {name}']:.0f} s so far; "
                    f"{len(self.ceiling.known)} workflows valued)",
                    flush=True,
                )
        for kind in ("expected", "best"):
            self.ceiling_calibration[kind] = [
                (
                    [self.ceiling.cached(t, r.anchor).of(kind) for r in e.rows],
                    realised_below(e),
                )
                for t, e in self.ceiling_played[CEILING_UCB]
                if e.rows
            ]
        for name, searches in self.ceiling_played.items():
            shaped = [e for _, e in searches if e.rows]
            self.ceiling_shape[name] = (
                statistics.fmean(len({r.anchor for r in e.rows}) for e in shaped),
                statistics.fmean(
                    statistics.fmean(r.anchor == e.rows[0].anchor for r in e.rows) for e in shaped
                ),
            )
        self.ceiling_values = [
            (v.of("expected"), v.of("best"))
            for v in (f.result() for f in self.ceiling.known.values())
        ]

    async def _transfer_ceiling(self) -> None:
        """--transfer-ceiling: on the held-out benchmark's evaluation tasks, the random proposer
        against policies that know more of it than a transferred policy can (UCB selection
        alone, every row): expected-greedy fitted on its own training-pool tasks and, unless
        left out (``--transfer-rows``), the cross-fitted one-step oracle."""
        args = self.args
        rows: list[tuple[str, Actor]] = [("random", UniformActor())]
        if "greedy" in args.transfer_rows:
            fit = {
                name: [Task(name, 3_000 + k, "training") for k in range(args.greedy_tasks)]
                for name in HELD_OUT
            }
            self.greedy = GreedyActor(self.env, self.base, fit)
            rows.append((TRANSFER_GREEDY, self.greedy))
        if "oracle" in args.transfer_rows:
            rows.append((TRANSFER_ORACLE, OracleActor(self.env, self.second)))
        for name, actor in rows:
            method = self.method(name)
            started = time.perf_counter()
            for seed in args.seeds:
                await self._play(method, actor, seed, ucb=True, tasks=self.transfer)
                gains = [method.gain.values[t, seed][0] for t in self.transfer]
                print(
                    f"{name:>28} seed {seed}: best-gain {statistics.fmean(gains):+.4f} "
                    f"({time.perf_counter() - started:.0f} s so far)",
                    flush=True,
                )
            method.seconds = time.perf_counter() - started

    async def _constant(self) -> int:
        """The best position k, chosen on tuning-pool tasks of the training benchmarks."""
        tasks = [
            Task(name, 4_000 + k, "tuning")
            for name in TRAIN
            for k in range(self.args.selection_tasks)
        ]
        tried = {}
        for k in range(LISTED):
            played = await evaluate_policy(
                self.base, self.env, IndexActor(k), tasks, seed=0, values=ValueTable.empty()
            )
            tried[k] = statistics.fmean(e.best_gain for e in played)
        print(
            "constants on tuning tasks: "
            + ", ".join(f"k={k + 1} {v:+.4f}" for k, v in tried.items()),
            flush=True,
        )
        return max(tried, key=lambda k: tried[k])

    # ---- the trained methods of one seed ----

    async def _distributions(
        self,
        states: Sequence[State],
        texts: Sequence[str] | None = None,
        orders: Sequence[Sequence[int]] | None = None,
    ) -> list[np.ndarray]:
        """pi(. | s) of the served policy on ``states`` (texts/orders: permuted listings)."""
        items = []
        for i, state in enumerate(states):
            text = texts[i] if texts is not None else state.text
            actions = (
                [state.actions[k] for k in orders[i]] if orders is not None else list(state.actions)
            )
            items.append(
                rollout_pb2.CandidateSet(
                    prompt=prompt_of(text), candidates=encoding.action_replies(actions)
                )
            )
        scored = await self.rollout.score(items)
        return [
            np.exp(action_log_probs(scores, len(s.actions)))
            for (scores, _), s in zip(scored, states, strict=True)
        ]

    async def _evaluate_policy(
        self, name: str, spec: RunSpec, seed: int, start: list[np.ndarray] | None
    ) -> list[np.ndarray]:
        """Play the served policy on the evaluation tasks and record its figures."""
        method = self.method(name)
        started = time.perf_counter()
        actor = policy_actor(spec, self.rollout)
        scale = self.args.value_scale
        await self._play(
            method,
            actor,
            seed,
            spec=spec,
            ucb=False,
            values=ScaledValues(scale) if name == "gigpo" and scale != 1.0 else None,
        )
        if name == "gigpo":
            await self._play(self.method("gigpo (ucb)"), actor, seed, spec=spec, ucb=True)
            for other in self.args.try_value_scales:
                await self._play(
                    self.method(f"gigpo (V x {other:g})"),
                    actor,
                    seed,
                    spec=spec,
                    ucb=False,
                    values=ScaledValues(other),
                    transfer=False,
                )
        pis = await self._distributions(self.states)
        for state, pi in zip(self.states, pis, strict=True):
            method.onestep.add(state.task, seed, float(np.dot(pi, state.rewards)))
            if name == "gigpo":  # the same policy: the same one-step figure
                self.method("gigpo (ucb)").onestep.add(
                    state.task, seed, float(np.dot(pi, state.rewards))
                )
        if start is not None:
            method.moved.append(
                statistics.fmean(total_variation(a, b) for a, b in zip(pis, start, strict=True))
            )
        method.seconds += time.perf_counter() - started
        return pis

    async def _seed(self, seed: int, initial: Path) -> None:
        args = self.args
        # The warm start alone.
        await self._load(initial)
        started = time.perf_counter()
        clock = self.clock()
        warm_dir = self.root / f"warm-{seed}"
        warm_spec = make_spec(
            args, steps=args.train_steps, seed=seed, iterations=0, checkpointDir=str(warm_dir)
        )
        await self._train(warm_spec, warm_dir)
        self.phase("train warm start", clock)
        warm_summary = json.loads((warm_dir / "warmstart" / "summary.json").read_text())
        warm = self.method("warm start")
        warm.seconds += time.perf_counter() - started
        warm.evaluations.append(warm_summary["warmstart/workflow_evaluations"])
        warm.executor_calls.append(warm_summary["warmstart/executor_calls"])
        warm_ckpt = self.root / f"warm-checkpoint-{seed}"
        await self.learner.save(str(warm_ckpt), b"")
        warm_pis = await self._evaluate_policy("warm start", warm_spec, seed, None)
        report("warm start", warm, seed)
        # RL from the warm start.
        rl_budget = 0.0
        for method_name, algorithm in (("gigpo", "gigpo"), ("grpo", "grpo")):
            if method_name not in args.methods:
                continue
            await self._load(warm_ckpt)
            started = time.perf_counter()
            run_dir = self.root / f"{method_name}-{seed}"
            # --try-iterations: one run as long as the longest count, with a checkpoint at each.
            counts = sorted({args.iterations, *args.try_iterations}) if algorithm == "gigpo" else []
            spec = make_spec(args, steps=args.train_steps, seed=seed, checkpointDir=str(run_dir))
            doc = spec.to_document()
            doc["trainer"]["warmStart"]["episodes"] = 0  # already warm
            if len(counts) > 1:
                doc["trainer"].update(checkpoints_at(counts))
            if algorithm == "grpo":
                doc["learner"]["algorithm"] = {"type": "grpo"}
            spec = RunSpec.from_document(doc)
            clock = self.clock()
            records = await self._train(spec, run_dir)
            self.phase(f"train {method_name}", clock)
            if len(counts) > 1:
                await self._other_iterations(
                    seed,
                    spec=spec,
                    run_dir=run_dir,
                    counts=counts,
                    records=records,
                    warm=warm,
                    warm_pis=warm_pis,
                )
                await self._load(checkpoint(run_dir, args.iterations))
                records = records[: args.iterations]
            method = self.method(method_name)
            method.seconds += time.perf_counter() - started
            evaluations = workflow_evaluations(records)
            method.evaluations.append(warm.evaluations[-1] + evaluations)
            method.executor_calls.append(
                warm.executor_calls[-1]
                + sum(
                    r.get("env/executor_calls", 0.0) + r.get("env/sibling_executor_calls", 0.0)
                    for r in records
                )
            )
            method.updates.extend(records)
            pis = await self._evaluate_policy(method_name, spec, seed, warm_pis)
            if method_name == "gigpo":
                rl_budget = evaluations
                await self._state_dependence(pis)
            report(method_name, method, seed)
        # The warm start alone at warm start + GiGPO's budget.
        if "equal-budget" in args.methods and rl_budget > 0:
            await self._load(initial)
            started = time.perf_counter()
            episodes = round(args.warm_episodes * (1.0 + rl_budget / warm.evaluations[-1]))
            run_dir = self.root / f"warm-equal-{seed}"
            spec = make_spec(
                args, steps=args.train_steps, seed=seed, iterations=0, checkpointDir=str(run_dir)
            )
            doc = spec.to_document()
            doc["trainer"]["warmStart"]["episodes"] = episodes
            doc["trainer"]["warmStart"]["epochs"] = max(
                1, round(args.warm_epochs * args.warm_episodes / episodes)
            )
            spec = RunSpec.from_document(doc)
            clock = self.clock()
            await self._train(spec, run_dir)
            self.phase("train warm start (equal budget)", clock)
            summary = json.loads((run_dir / "warmstart" / "summary.json").read_text())
            method = self.method("warm start (equal budget)")
            method.seconds += time.perf_counter() - started
            method.evaluations.append(summary["warmstart/workflow_evaluations"])
            method.executor_calls.append(summary["warmstart/executor_calls"])
            await self._evaluate_policy("warm start (equal budget)", spec, seed, None)
            report(f"warm start (equal budget, {episodes} episodes)", method, seed)

    async def _other_iterations(
        self,
        seed: int,
        *,
        spec: RunSpec,
        run_dir: Path,
        counts: Sequence[int],
        records: Sequence[dict[str, Any]],
        warm: Method,
        warm_pis: list[np.ndarray],
    ) -> None:
        """--try-iterations: GiGPO after each other count of iterations (the checkpoints of
        one run as long as the longest: the first k iterations of a longer run are a k-iteration
        run, the learning rate being constant), played as GiGPO is (``fused`` on its values)."""
        for count in counts:
            if count == self.args.iterations:
                continue
            await self._load(checkpoint(run_dir, count))
            name = iterations_name(count)
            method = self.method(name)
            method.updates.extend(records[:count])
            method.evaluations.append(warm.evaluations[-1] + workflow_evaluations(records[:count]))
            await self._evaluate_policy(name, spec, seed, warm_pis)
            report(name, method, seed)

    async def _state_dependence(self, pis: list[np.ndarray]) -> None:
        """state-TV and the shuffle check of the served (GiGPO) policy (module docstring)."""
        by_list: dict[tuple[str, ...], list[int]] = {}
        for i, state in enumerate(self.states):
            by_list.setdefault(state.actions, []).append(i)
        pairs = [(i, j) for group in by_list.values() for i, j in itertools.combinations(group, 2)]
        self.tv.append(statistics.fmean(total_variation(pis[i], pis[j]) for i, j in pairs))
        rng = np.random.default_rng(len(self.tv))
        orders = [rng.permutation(len(s.actions)).tolist() for s in self.states]
        texts = [
            permuted_text(s.text, s.actions, o) for s, o in zip(self.states, orders, strict=True)
        ]
        permuted = await self._distributions(self.states, texts, orders)
        content = statistics.fmean(
            total_variation(q, p[o]) for q, p, o in zip(permuted, pis, orders, strict=True)
        )
        position = statistics.fmean(
            total_variation(q, p) for q, p in zip(permuted, pis, strict=True)
        )
        self.shuffle.append((content, position))

    # ---- figures ----

    def has(self, name: str, tasks: Sequence[Task]) -> bool:
        """Whether method ``name`` played every (task, seed) cell of ``tasks``."""
        method = self.methods.get(name)
        return method is not None and all(
            (t, s) in method.gain.values for t in tasks for s in self.args.seeds
        )

    def figure(
        self, name: str, metric: str, tasks: Sequence[Task], minus: str | None = None
    ) -> Figure:
        seeds = self.args.seeds
        a = getattr(self.methods[name], metric).matrix(tasks, seeds)
        if minus is not None:
            a = a - getattr(self.methods[minus], metric).matrix(tasks, seeds)
        clusters = [bootstrap_unit(t) for t in tasks]
        return Figure(float(a.mean()), two_way_bootstrap(a, self.args.bootstrap, clusters=clusters))


def checkpoint(run_dir: Path, iterations: int) -> Path:
    """The checkpoint the run in ``run_dir`` saved after ``iterations`` (its own index)."""
    for entry in CheckpointIndex(run_dir).entries():
        if entry.iteration == iterations:
            return Path(entry.path)
    raise RuntimeError(f"{run_dir} holds no checkpoint after {iterations} iterations")


def checkpoints_at(counts: Sequence[int]) -> dict[str, int]:
    """The trainer fields of one run that saves, and keeps, a checkpoint after each of
    ``counts`` iterations (and at multiples of their common divisor between them)."""
    every = math.gcd(*counts)
    return {
        "iterations": max(counts),
        "checkpointEvery": every,
        "keepCheckpoints": max(counts) // every,
    }


def workflow_evaluations(records: Sequence[dict[str, Any]]) -> float:
    """The workflow evaluations the iterations of ``records`` (metrics.jsonl lines) made."""
    return float(sum(r.get("env/workflow_evaluations", 0.0) for r in records))


def iterations_name(count: int) -> str:
    return f"gigpo ({count} it)"


def report(name: str, method: Method, seed: int) -> None:
    gains = [v for (task, s), vs in method.gain.values.items() if s == seed for v in vs]
    onestep = [v for (task, s), vs in method.onestep.values.items() if s == seed for v in vs]
    print(
        f"{name:>28} seed {seed}: best-gain {statistics.fmean(gains):+.4f}, one-step "
        f"{statistics.fmean(onestep):+.4f} ({method.seconds:.0f} s so far)",
        flush=True,
    )


def print_tables(bench: Bench) -> None:
    args = bench.args
    order = [
        "random",
        "uniform new",
        getattr(bench, "constant", ""),
        "expected-greedy",
        "oracle",
        "warm start",
        "warm start (equal budget)",
        "gigpo",
        "gigpo (ucb)",
        *(iterations_name(n) for n in sorted(args.try_iterations)),
        "grpo",
    ]
    names = [n for n in order if n in bench.methods]
    print(
        f"\nSplit {args.split}: {len(bench.tasks)} tasks of {', '.join(TRAIN)} and "
        f"{len(bench.transfer)} of {', '.join(HELD_OUT)} (held out), {len(args.seeds)} seeds; "
        "mean ± two-way cluster-bootstrap SE over (task, seed)"
    )
    header = (
        f"{'method':<28}{'best-gain':>18}{'one-step E[r]':>18}{'held-out bm':>18}"
        f"{'dup':>6}{'evaluations':>12}{'calls':>9}{'moved':>7}"
    )
    print(header)
    for name in names:
        m = bench.methods[name]
        cells = [
            bench.figure(name, "gain", bench.tasks) if bench.has(name, bench.tasks) else "-",
            bench.figure(name, "onestep", bench.tasks),
            bench.figure(name, "gain", bench.transfer) if bench.has(name, bench.transfer) else "-",
        ]
        duplicates = f"{statistics.fmean(m.duplicates):>6.2f}" if m.duplicates else f"{'-':>6}"
        budget = f"{statistics.fmean(m.evaluations):>12.0f}" if m.evaluations else f"{'-':>12}"
        calls = f"{statistics.fmean(m.executor_calls):>9.0f}" if m.executor_calls else f"{'-':>9}"
        moved = f"{statistics.fmean(m.moved):>7.3f}" if m.moved else f"{'-':>7}"
        print(
            f"{name:<28}"
            + "".join(f"{c!s:>18}" for c in cells)
            + f"{duplicates}{budget}{calls}{moved}"
        )
    print("\nPaired differences (best-gain; one-step E[r]) on the training benchmarks' tasks:")
    comparisons = [
        ("gigpo", "warm start"),
        ("gigpo", "expected-greedy"),
        ("gigpo", "gigpo (ucb)"),
        ("gigpo", "warm start (equal budget)"),
        ("gigpo", "grpo"),
        ("gigpo", "random"),
        ("warm start", "random"),
        ("expected-greedy", "random"),
        ("oracle", "random"),
    ]
    for a, b in comparisons:
        if a in bench.methods and b in bench.methods:
            onestep = bench.figure(a, "onestep", bench.tasks, minus=b)
            gain = (
                f"{bench.figure(a, 'gain', bench.tasks, minus=b)} "
                f"({bench.figure(a, 'gain', bench.tasks, minus=b).z:+.1f} SE)"
                if bench.has(a, bench.tasks) and bench.has(b, bench.tasks)
                else "-"
            )
            print(f"  {a} - {b}: {gain}; one-step {onestep} ({onestep.z:+.1f} SE)")
    for name in ("gigpo", "grpo"):
        if name not in bench.methods or not bench.methods[name].updates:
            continue
        updates = bench.methods[name].updates

        def span(key: str, updates: list[dict[str, Any]] = updates) -> str:
            values = [
                u[key] for u in updates if isinstance(u.get(key), float) and math.isfinite(u[key])
            ]
            return f"{min(values):.3f}..{max(values):.3f}" if values else "-"

        print(
            f"{name} updates ({len(updates)} iterations): approx_kl {span('charts/approx_kl')}, "
            f"clip fraction {span('charts/clipfrac')}, candidate clip fraction "
            f"{span('charts/candidate_clipfrac')}, update KL {span('policy/update_kl')}, "
            f"TV from the warm start after the iteration {span('policy/start_tv')}, "
            f"entropy {span('policy/entropy')}"
        )
    for count in args.try_iterations:
        name = iterations_name(count)
        if count == args.iterations or name not in bench.methods:
            continue
        for b in ("gigpo", "warm start"):
            lead = bench.figure(name, "gain", bench.tasks, minus=b)
            onestep = bench.figure(name, "onestep", bench.tasks, minus=b)
            print(
                f"  {name} - {b}: {lead} ({lead.z:+.1f} SE); one-step {onestep} "
                f"({onestep.z:+.1f} SE)"
            )
    for name in bench.methods:
        if name.startswith("gigpo (V x") and bench.has("gigpo (ucb)", bench.tasks):
            lead = bench.figure(name, "gain", bench.tasks, minus="gigpo (ucb)")
            print(
                f"  {name} - gigpo (ucb): {lead} ({lead.z:+.1f} SE); best-gain "
                f"{bench.figure(name, 'gain', bench.tasks)}"
            )
    if "gigpo" in bench.methods and "random" in bench.methods:
        transfer = bench.figure("gigpo", "gain", bench.transfer, minus="random")
        print(
            f"  on {', '.join(HELD_OUT)} (held out): gigpo - random: {transfer} "
            f"({transfer.z:+.1f} SE)"
        )
    print_greedy_fit(bench, "expected-greedy")
    print_ceiling(bench)
    print_calibration(bench)
    if bench.shuffle:
        content = statistics.fmean(c for c, _ in bench.shuffle)
        position = statistics.fmean(p for _, p in bench.shuffle)
        print(
            f"shuffle: TV to the permuted distribution {content:.3f}, to the unpermuted one "
            f"{position:.3f}; state-TV between states listing the same candidates "
            f"{statistics.fmean(bench.tv):.3f}"
        )
    print_phases(bench)


def print_value_ceiling(bench: Bench) -> None:
    """--value-ceiling: UCB against fused selection on oracle values, paired by (task, seed)."""
    args = bench.args
    tasks = bench.tasks
    units = len({bootstrap_unit(t) for t in tasks})
    print(
        f"\nValue ceiling, split {args.split}: the random proposer on {len(tasks)} tasks of "
        f"{', '.join(TRAIN)} ({units} bootstrap units) x {len(args.seeds)} seeds, "
        f"{args.steps}-step searches; fused selection on oracle V*(s) (cross-fitted: executor "
        "sample 1) against UCB alone; mean ± two-way cluster-bootstrap SE over (task, seed)"
    )
    print(
        f"{'search':<46}{'best-gain':>18}{'minus ucb':>18}{'z':>7}{'Spearman':>10}"
        f"{'within':>8}{'parents':>9}{'root':>6}"
    )
    names = [n for n in bench.methods if n == CEILING_UCB or n.startswith("random (fused")]
    leads: list[tuple[str, Figure]] = []
    for name in names:
        gain = bench.figure(name, "gain", tasks)
        parents, root = bench.ceiling_shape.get(name, (math.nan, math.nan))
        shape = f"{parents:>9.1f}{root:>6.2f}"
        if name == CEILING_UCB:
            print(f"{name:<46}{gain!s:>18}{'-':>18}{'-':>7}{'-':>10}{'-':>8}{shape}")
            continue
        lead = bench.figure(name, "gain", tasks, minus=CEILING_UCB)
        leads.append((name, lead))
        pooled, within, _ = calibration(bench.methods[name])
        print(
            f"{name:<46}{gain!s:>18}{lead!s:>18}{lead.z:>+7.1f}{pooled:>+10.3f}{within:>+8.3f}"
            f"{shape}"
        )
    print(
        "(Spearman: V*(s) read at each step against the gain realised below s, in that row's "
        "own searches, pooled over steps and the mean within episodes; parents: workflows a "
        "search modified, mean; root: share of steps that modified the seed workflow)"
    )
    for kind, pairs in bench.ceiling_calibration.items():
        pooled, within, count = calibration(Method(kind, calibration=pairs))
        print(
            f"V* {kind} in the UCB searches: Spearman(V*(s), gain realised below s) pooled "
            f"{pooled:+.3f}, within episodes {within:+.3f} (mean of {count})"
        )
    if bench.ceiling_values:
        values = bench.ceiling_values
        print(
            f"V* over the {len(values)} workflows valued: expected gain mean "
            f"{statistics.fmean(e for e, _ in values):.4f} (zero at "
            f"{statistics.fmean(e == 0.0 for e, _ in values):.0%}), best gain mean "
            f"{statistics.fmean(b for _, b in values):.4f} (zero at "
            f"{statistics.fmean(b == 0.0 for _, b in values):.0%})"
        )
    if leads:
        name, lead = max(leads, key=lambda item: item[1].z)
        cells = units * len(args.seeds)
        if lead.mean > 0 and lead.z < 2.0:
            factor = cells_for(2.0, lead, cells) / cells
            print(
                f"largest lead: {name} {lead} ({lead.z:+.1f} SE); at that effect, +2 SE needs "
                f"about {factor:.1f} times the {units} units x {len(args.seeds)} seeds "
                f"({factor * cells:.0f} (unit, seed) cells)"
            )
        else:
            print(f"largest lead: {name} {lead} ({lead.z:+.1f} SE)")


def cells_for(target: float, lead: Figure, cells: int) -> float:
    """The (unit, seed) cells a paired lead measured at ``lead`` on ``cells`` cells would need
    for ``target`` SE, the effect held and the SE shrinking as one over the root of the cells:
    cells (target / z)^2; infinite for a lead that is not positive."""
    if lead.mean <= 0:
        return math.inf
    return cells * (target / lead.z) ** 2 if math.isfinite(lead.z) else 0.0


def print_greedy_fit(bench: Bench, name: str) -> None:
    """How well expected-greedy's table was fitted (if it was): states, tasks per state, the SE
    of the chosen action's mean one-step reward and its lead over the second best."""
    greedy = getattr(bench, "greedy", None)
    if greedy is None or not greedy.fits:
        return
    print(
        f"{name} fit: {len(greedy.fits)} states, {bench.args.greedy_tasks} training-pool "
        "tasks each; the chosen action's mean one-step reward has SE "
        f"{statistics.fmean(se for se, _ in greedy.fits):.4f} over them (mean over states), "
        f"its lead over the second best {statistics.fmean(d for _, d in greedy.fits):.4f}"
    )


def print_transfer_ceiling(bench: Bench) -> None:
    """--transfer-ceiling: each row's best-gain on the held-out benchmark and its paired lead
    over random, with the cells +2 SE would need at that lead."""
    args = bench.args
    tasks = bench.transfer
    units = len({bootstrap_unit(t) for t in tasks})
    cells = units * len(args.seeds)
    print(
        f"\nTransfer ceiling, split {args.split}: {len(tasks)} tasks of {', '.join(HELD_OUT)} "
        f"(held out; {units} bootstrap units) x {len(args.seeds)} seeds, {args.steps}-step "
        "searches, UCB selection; mean ± two-way cluster-bootstrap SE over (task, seed)"
    )
    print(
        f"{'proposer':<26}{'best-gain':>18}{'minus random':>18}{'z':>7}"
        f"{'cells for +2 SE':>17}{'seconds':>9}"
    )
    for name in ("random", TRANSFER_GREEDY, TRANSFER_ORACLE):
        if name not in bench.methods:
            continue
        gain = bench.figure(name, "gain", tasks)
        seconds = f"{bench.methods[name].seconds:>9.0f}"
        if name == "random":
            print(f"{name:<26}{gain!s:>18}{'-':>18}{'-':>7}{'-':>17}{seconds}")
            continue
        lead = bench.figure(name, "gain", tasks, minus="random")
        needed = cells_for(2.0, lead, cells)
        print(f"{name:<26}{gain!s:>18}{lead!s:>18}{lead.z:>+7.1f}{needed:>17.0f}{seconds}")
    print_greedy_fit(bench, TRANSFER_GREEDY)
    print(
        f"(cells for +2 SE: (unit, seed) cells at which the lead, held, would reach +2 SE; "
        f"this run has {cells})"
    )


def print_phases(bench: Bench) -> None:
    print(
        "time per phase (wall, CPU of the bench and its services): "
        + ", ".join(
            f"{name} {seconds:.0f} s ({bench.cpu.get(name, math.nan):.0f} s CPU)"
            for name, seconds in bench.phases.items()
        )
    )


def print_ceiling(bench: Bench) -> None:
    """The one-step ceiling chosen and scored on one executor sample against the cross-fitted
    one, and the effective number of distinct actions per state, per benchmark."""
    print("\nOne-step ceiling and effective actions on the held-out states (mean over states):")
    for name in (*TRAIN, *HELD_OUT):
        states = [s for s in bench.states if s.benchmark == name]
        if not states:
            continue
        mean_r = [statistics.fmean(s.rewards) for s in states]
        same = [max(s.rewards) - m for s, m in zip(states, mean_r, strict=True)]
        cross = [
            s.rewards[s.readings.cross_fitted] - m for s, m in zip(states, mean_r, strict=True)
        ]
        distinct = [s.readings.distinct for s in states]
        print(
            f"  {name:<9} {len(states):>4} states: oracle lead over random, same sample "
            f"{statistics.fmean(same):+.4f}, cross-fitted {statistics.fmean(cross):+.4f}; "
            f"distinct actions {statistics.fmean(distinct):.1f} of "
            f"{statistics.fmean(len(s.actions) for s in states):.1f} listed"
        )


def calibration(method: Method) -> tuple[float, float, int]:
    """(pooled Spearman of V(s) and the gain realised below s, the mean of the per-episode
    ones, episodes with a defined one)."""
    values = [v for vs, _ in method.calibration for v in vs]
    gains = [g for _, gs in method.calibration for g in gs]
    per_episode = [spearman(vs, gs) for vs, gs in method.calibration]
    defined = [r for r in per_episode if math.isfinite(r)]
    pooled = spearman(values, gains) if values else math.nan
    return pooled, statistics.fmean(defined) if defined else math.nan, len(defined)


def print_calibration(bench: Bench) -> None:
    for name in ("gigpo", "warm start"):
        if name in bench.methods and bench.methods[name].calibration:
            pooled, per_episode, count = calibration(bench.methods[name])
            episodes = bench.methods[name].calibration
            spread = statistics.fmean(max(vs) - min(vs) for vs, _ in episodes)
            realised = statistics.fmean(max(gs) - min(gs) for _, gs in episodes)
            print(
                f"{name} values' calibration: Spearman(V(s), gain realised below s) pooled "
                f"{pooled:+.3f}, within episodes {per_episode:+.3f} (mean of {count}); "
                f"V(s) spans {spread:.4f} within an episode (mean), the gains realised "
                f"{realised:.4f}"
            )


def final_line(bench: Bench) -> str:
    start = bench.figure("gigpo", "gain", bench.tasks, minus="warm start")
    greedy = bench.figure("gigpo", "gain", bench.tasks, minus="expected-greedy")
    fused = bench.figure("gigpo", "gain", bench.tasks, minus="gigpo (ucb)")
    transfer = bench.figure("gigpo", "gain", bench.transfer, minus="random")
    share = learnable_share(
        bench.figure("gigpo", "onestep", bench.tasks).mean,
        bench.figure("random", "onestep", bench.tasks).mean,
        bench.figure("oracle", "onestep", bench.tasks).mean,
    )
    content = statistics.fmean(c for c, _ in bench.shuffle)
    position = statistics.fmean(p for _, p in bench.shuffle)
    shuffle = "ok" if content <= 0.5 * position else "FAIL"
    return (
        f"learning: gigpo-start={start.z:+.1f} SE gigpo-greedy={greedy.z:+.1f} SE "
        f"fused-ucb={fused.z:+.1f} SE transfer={transfer.z:+.1f} SE "
        f"learnable-share={share:.2f} shuffle={shuffle}"
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument(
        "--methods",
        nargs="+",
        default=["gigpo"],
        choices=["gigpo", "grpo", "equal-budget"],
        help="trained methods besides the warm start (grpo and equal-budget: ablations)",
    )
    p.add_argument("--split", choices=sorted(SPLIT_POOL), default="eval")
    p.add_argument("--preset", default="tiny", choices=["tiny", "small", "base"])
    # RL (chosen on tuning tasks: README, "How the defaults were chosen")
    p.add_argument("--iterations", type=int, default=12)
    p.add_argument("--tasks-per-iteration", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3, help="learner.optimizer.lr (RL)")
    p.add_argument("--epochs", type=int, default=4, help="learner.loss.epochs")
    p.add_argument("--mini-batch", type=int, default=16, help="learner.loss.miniBatchSize")
    p.add_argument("--kl-coef", type=float, default=0.02, help="learner.loss.klCoef (exact)")
    p.add_argument("--value-coef", type=float, default=0.05, help="policy.value.lossCoef")
    p.add_argument("--mode", default="mean_std_norm", choices=["mean_norm", "mean_std_norm"])
    p.add_argument("--siblings", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--step-w", type=float, default=1.0, help="GiGPO's stepAdvantageW")
    # The warm start
    p.add_argument("--warm-episodes", type=int, default=40)
    p.add_argument("--warm-epochs", type=int, default=20)
    p.add_argument("--warm-lr", type=float, default=3e-3)
    p.add_argument("--tau", type=float, default=0.05)
    p.add_argument("--warm-value-coef", type=float, default=0.5)
    # The environment and the evaluation
    p.add_argument("--problems", type=int, default=20, help="validation problems per task")
    p.add_argument(
        "--steps", type=int, default=10, help="edits per evaluation episode (the searches judged)"
    )
    p.add_argument(
        "--train-steps",
        type=int,
        default=4,
        help="edits per training and warm-start episode (the policy proposes one edit at a time; "
        "sibling groups evaluate every listed action at each step, so training cost grows "
        "with this)",
    )
    p.add_argument(
        "--state-steps",
        type=int,
        default=3,
        help="held-out states: the first N states of one random episode per evaluation task",
    )
    p.add_argument("--ucb-c", type=float, default=0.1)
    p.add_argument(
        "--value-scale",
        type=float,
        default=1.0,
        help="GiGPO's fused searches send V(s) times this (another search.fusedW: ScaledValues)",
    )
    p.add_argument(
        "--try-value-scales",
        type=float,
        nargs="*",
        default=[],
        help="also play GiGPO's fused search at these value scales (with --split tuning: "
        "how --value-scale is chosen)",
    )
    p.add_argument(
        "--try-iterations",
        type=int,
        nargs="*",
        default=[],
        help="also play GiGPO after these numbers of iterations (checkpoints of one run as long "
        "as the longest; with --split tuning: how --iterations is chosen)",
    )
    p.add_argument(
        "--value-ceiling",
        action="store_true",
        help="instead of the bench: the random proposer with UCB selection against fused "
        "selection on oracle values V*(s) (a ceiling of what values add to parent selection)",
    )
    p.add_argument(
        "--transfer-ceiling",
        action="store_true",
        help="instead of the bench: on the held-out benchmark's evaluation tasks, the random "
        "proposer against expected-greedy fitted on that benchmark's own training-pool tasks "
        "and the cross-fitted one-step oracle (a ceiling of transfer)",
    )
    p.add_argument(
        "--transfer-rows",
        nargs="*",
        default=["greedy", "oracle"],
        choices=["greedy", "oracle"],
        help="--transfer-ceiling: the rows played besides random",
    )
    p.add_argument(
        "--ceiling-kinds",
        nargs="+",
        default=list(ORACLE_KINDS),
        choices=ORACLE_KINDS,
        help="--value-ceiling: V*(s) the random proposer's expected one-step gain over s, the "
        "best one-step gain over s, the proposer's expected gain over the tree's best "
        "(greedy), all cross-fitted, or greedy on the search's own sample (greedy-same: not "
        "cross-fitted, a bound no value reaches) (OracleValue.of)",
    )
    p.add_argument(
        "--ceiling-scales",
        type=float,
        nargs="+",
        default=[1.0, 4.0, 1000.0],
        help="--value-ceiling: V* sent times these (at fusedW 0.5: V's weight 0.5, 0.8, 0.999)",
    )
    p.add_argument(
        "--reward",
        default="improvement",
        choices=["delta-parent", "delta-best", "improvement"],
        help="search.reward",
    )
    p.add_argument("--observation-chars", type=int, default=2000)
    p.add_argument(
        "--list-duplicates",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="search.listDuplicates (off: every listed action makes a new workflow)",
    )
    p.add_argument(
        "--failed-examples",
        type=int,
        default=0,
        help="search.failedExamples (the tiny policy does not read them; they triple the "
        "prompt and the learner's attention cost)",
    )
    p.add_argument("--eval-tasks", type=int, default=7, help="per benchmark")
    p.add_argument(
        "--eval-episodes",
        type=int,
        default=1,
        help="per task and seed (a cell's figure is their mean; the cell stays the unit)",
    )
    p.add_argument("--greedy-tasks", type=int, default=6, help="per benchmark")
    p.add_argument("--selection-tasks", type=int, default=3, help="per training benchmark")
    p.add_argument("--bootstrap", type=int, default=2000)
    p.add_argument(
        "--more-references",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also the rows no verdict reads: uniform new, and constant (k chosen on tuning tasks)",
    )
    p.add_argument(
        "--references",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="play the reference rows (--no-references: the trained methods alone, for tuning)",
    )
    p.add_argument("--threads", type=int, default=2, help="torch threads per service")
    p.add_argument("--data-dir", default=os.environ.get("AFLOWRL_DATA_DIR"))
    p.add_argument("--keep", metavar="DIR", help="keep every run's directory under DIR")
    p.add_argument(
        "--dump", metavar="FILE", help="pickle every method's cells and the states to FILE"
    )
    p.add_argument(
        "--from-dump",
        metavar="FILE",
        nargs="+",
        help="print the tables of --dump FILEs (runs with the same arguments but disjoint "
        "--seeds, which then lists them all: merge_dumps) instead of running",
    )
    return p


def dump_seeds(data: dict[str, Any]) -> set[int]:
    """The seeds whose cells a --dump holds."""
    return {seed for m in data["methods"].values() for _, seed in m.gain.values}


def merge_dumps(dumps: Sequence[dict[str, Any]], seeds: Sequence[int]) -> dict[str, Any]:
    """One dump of runs made with the same arguments but disjoint seeds: every method's cells
    and per-seed lists joined, the held-out states and the expected-greedy fit (the same in each
    run: they do not depend on the seed) from the first, the phases' seconds added. ``seeds``
    (the printing run's ``--seeds``) must be exactly the seeds the dumps hold."""
    if len(dumps) > 1 and any(d.get("ceiling_values") or d.get("ceiling_shape") for d in dumps):
        raise ValueError("a --value-ceiling dump is read alone (its values are per run)")
    held = [dump_seeds(d) for d in dumps]
    if sum(map(len, held)) != len(set().union(*held)):
        raise ValueError(f"the dumps share seeds ({' '.join(str(sorted(h)) for h in held)})")
    if set().union(*held) != set(seeds):
        raise ValueError(
            f"the dumps hold seeds {sorted(set().union(*held))}, --seeds lists {sorted(seeds)}"
        )
    first = dumps[0]

    def held_out(d: dict[str, Any]) -> list[tuple[str, str]]:
        # The same states, in the order the concurrent episodes reached them.
        return sorted((repr(s.task), s.text) for s in d["states"])

    for d in dumps[1:]:
        if held_out(d) != held_out(first):
            raise ValueError("the dumps' held-out states differ (not the same arguments)")
    methods: dict[str, Method] = {}
    for d in dumps:
        for name, m in d["methods"].items():
            into = methods.setdefault(name, Method(name))
            for f in dataclasses.fields(Method):  # every column, whatever Method gains later
                ours, theirs = getattr(into, f.name), getattr(m, f.name)
                if isinstance(ours, Cells):
                    for key, values in theirs.values.items():
                        ours.values.setdefault(key, []).extend(values)
                elif isinstance(ours, list):
                    ours.extend(theirs)
                elif isinstance(ours, float):
                    setattr(into, f.name, ours + theirs)
    phases: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for d in dumps:
        for total, part in ((phases, d["phases"]), (cpu, d.get("cpu", {}))):
            for k, v in part.items():
                total[k] = total.get(k, 0.0) + v
    return {
        **first,
        "methods": methods,
        "tv": [x for d in dumps for x in d["tv"]],
        "shuffle": [x for d in dumps for x in d["shuffle"]],
        "phases": phases,
        "cpu": cpu,
    }


@dataclass
class GreedyFits:
    """What the tables read of expected-greedy (a run printed from its dump)."""

    fits: list[tuple[float, float]]


def main() -> None:
    args = parser().parse_args()
    if not args.data_dir:
        sys.exit("bench/learning.py needs the AFlow splits: --data-dir DIR or $AFLOWRL_DATA_DIR")
    started = time.perf_counter()
    if args.from_dump:
        dumps = []
        for name in args.from_dump:
            with open(name, "rb") as f:
                dumps.append(pickle.load(f))  # files --dump wrote
        try:
            data = merge_dumps(dumps, args.seeds)
        except ValueError as exc:
            sys.exit(f"--from-dump: {exc}")
        bench = Bench(args, Path(tempfile.gettempdir()))
        bench.methods, bench.states = data["methods"], data["states"]
        bench.tv, bench.shuffle, bench.phases = data["tv"], data["shuffle"], data["phases"]
        bench.cpu = data.get("cpu", {})
        bench.greedy = GreedyFits(data["greedy_fits"])
        bench.ceiling_calibration = data.get("ceiling_calibration", {})
        bench.ceiling_values = data.get("ceiling_values", [])
        bench.ceiling_shape = data.get("ceiling_shape", {})
    elif args.keep:
        bench = Bench(args, Path(args.keep))
        asyncio.run(bench.run())
    else:
        with tempfile.TemporaryDirectory(prefix="aflowrl-learning-") as tmp:
            bench = Bench(args, Path(tmp))
            asyncio.run(bench.run())
    if args.dump:
        with open(args.dump, "wb") as f:
            pickle.dump(
                {
                    "methods": bench.methods,
                    "states": bench.states,
                    "tv": bench.tv,
                    "shuffle": bench.shuffle,
                    "phases": bench.phases,
                    "cpu": bench.cpu,
                    "greedy_fits": getattr(getattr(bench, "greedy", None), "fits", []),
                    "ceiling_calibration": bench.ceiling_calibration,
                    "ceiling_values": bench.ceiling_values,
                    "ceiling_shape": bench.ceiling_shape,
                },
                f,
            )
    if args.value_ceiling:
        print_value_ceiling(bench)
        print_phases(bench)
    elif args.transfer_ceiling:
        print_transfer_ceiling(bench)
        print_phases(bench)
    else:
        print_tables(bench)
    print(f"({time.perf_counter() - started:.0f} s in all, {tree_cpu_seconds():.0f} s CPU)")
    if "gigpo" in bench.methods and bench.shuffle and args.references:
        print(final_line(bench))


if __name__ == "__main__":
    main()
