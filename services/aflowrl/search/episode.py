"""One optimisation episode as a pure, deterministic state machine (the RL environment).

::

    ctx = SearchContext(evaluator, problems, search=spec.search, evaluation=spec.evaluation)
    start = await reset(ctx, seed=7)                    # evaluates the seed workflow
    outcome = await step(ctx, start.state, "<action>add ScEnsemble after generate</action>")
    outcome.state, outcome.observation, outcome.reward, outcome.done, outcome.info

:func:`reset` evaluates the seed workflow, selects the first parent and returns the state and
the observation. :func:`step` projects the action text onto an admissible action of the parent
(:mod:`aflowrl.search.projection`); an invalid action is a no-op that still takes a step (reward
0, ``info.valid_action`` False: the trainer applies the penalty after discounting). A valid
action makes the child. The reward, exactly:

* a new workflow: it is evaluated on the episode's problems, added under its parent, and the
  reward is its validation score minus the parent's (``search.reward = delta-parent``), minus
  the best score before the step (``delta-best``), or what it adds to that best score,
  max(0, child - best) (``improvement``: the episode's return is then its best-gain, when
  positive);
* a workflow the tree already holds (same canonical hash: a *duplicate*): nothing is evaluated,
  no improvement is paid, and the reward is ``-search.duplicatePenalty``;
* an invalid action: 0 here, ``-invalidActionPenalty`` applied by the trainer.

Reward noise (``evaluation.resampleFraction``): for that share of new, fully scored children
(chosen by a hash of the episode seed, the step and the child, so a retry chooses the same),
the reward is measured a second time on other executor sample indices: the base workflow and
then the child are scored on samples R..2R-1 of the same problems (samples 0..R-1 come from the
cache; the child reuses the base's draws exactly as it did on 0..R-1), and the same reward
formula on those scores is ``info.resampled_reward``. The difference between the two readings
of one reward is pure executor-sample noise (the spread among sibling edits is not: they differ
in the workflow); the trainer reports its size (:mod:`aflowrl.trainer.noise`).

The episode's headline is its *best-gain*: the best score among the workflows it added minus
the seed's (0 while it added none; ``info.best_gain``).

After the step the convergence counter moves (the top-k mean score unchanged for
``convergence_rounds`` steps ends the episode, as does ``max_steps``), the next parent is
selected (:mod:`aflowrl.search.selection`, randomness seeded by (seed, step)) and its
observation rendered; its anchor is the canonical hash of that parent.

Racing (``evaluation.racing``, off by default and refused with ``aflow`` selection): a new
child is scored in a random order of the problems, a batch at a time, and stopped once its full
score is below the reward's base (the parent's score, or the best score for ``delta-best`` and
``improvement``) with
probability at least 1 - delta (:mod:`aflowrl.workflow.racing`). The child enters the tree
marked ``raced_after`` with its partial mean, which is below the base by construction, so its
reward is negative: a raced-out edit never earns an improvement, and the partial mean (taken
when it happened to be low enough to stop) leans pessimistic, never optimistic, so a policy has
nothing to gain from edits that get raced out. GiGPO sees it as one more bad action of its step
group. A raced node's partial mean is never used as a base: before a step modifies a raced node,
or lands on one as a duplicate, the node is scored in full (the cost goes into that step).

Nothing is kept between calls: the state carries the episode, the evaluator (with its cache)
and the problems come in with the :class:`SearchContext`. So any replica can serve any step,
and a retried step gives the same result (given the same value source: fused selection reads
values at the time of the step). :func:`project_action` maps action text to the child's hash
without evaluating (for routing a step to the replica that caches that child).

Used by ``aflowrl optimize`` (:mod:`aflowrl.search.optimize`) and the environment service.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Final

from aflowrl.benchmarks.base import Problem
from aflowrl.config import SearchSpec
from aflowrl.config.environment import EvaluationSpec, PoolName, racing_conflict
from aflowrl.errors import InvalidInputError
from aflowrl.search import selection
from aflowrl.search.edits import Candidate, admissible_actions
from aflowrl.search.errors import EpisodeOverError, EpisodeStateError
from aflowrl.search.observation import ObservationInput, render_observation
from aflowrl.search.projection import ActionMode, Projection, project
from aflowrl.search.state import (
    ACTION_CHARS_INVALID,
    PRODUCED_CHARS,
    STATE_VERSION,
    Attempt,
    EpisodeState,
    TreeNode,
    WrongRun,
    graph_at,
    problems_digest,
)
from aflowrl.search.values import ValueQuery, ValueSource
from aflowrl.seeding import derive_seed
from aflowrl.workflow import EvaluationResult, Evaluator, Graph, library, pool_problems, subset
from aflowrl.workflow.evaluator import Race, disjoint_chunk

_SAME: Final = 1e-12
"""Top-k means closer than this count as unchanged (float noise only)."""


@dataclass(frozen=True)
class SearchContext:
    """What a step needs besides the state: the evaluator, the problems, the settings.

    ``problems`` is the whole split workflows are scored on; each episode scores on a fixed
    subset of ``evaluation.max_problems`` of them chosen by its seed. ``values`` is the value
    source of ``fused`` selection (required for it).
    """

    evaluator: Evaluator
    problems: Sequence[Problem]
    search: SearchSpec = field(default_factory=SearchSpec)
    evaluation: EvaluationSpec = field(default_factory=EvaluationSpec)
    values: ValueSource | None = None
    test_problems: Sequence[Problem] = ()
    """The benchmark's test split, for episodes of the ``test`` pool (evaluation tasks)."""

    @cached_property
    def problems_by_id(self) -> Mapping[str, Problem]:
        return {p.problem_id: p for p in self.problems}

    @property
    def executor_key(self) -> str:
        """Executor id and run settings (what the evaluation cache keys on)."""
        return self.evaluator.executor_key

    def episode_problems(self, seed: int, count: int | None, pool: str = "all") -> list[Problem]:
        """The ``count`` problems of ``pool`` seed ``seed`` chooses (``evaluation.pools``;
        ``test``: chunk ``seed`` of the test split, :func:`disjoint_chunk`)."""
        benchmark = self.evaluator.benchmark.name
        if pool == "test":
            if not self.test_problems:
                raise InvalidInputError(
                    f"no {benchmark} test split is loaded: no test-pool episodes",
                    field="problem_pool",
                )
            return disjoint_chunk(self.test_problems, count, seed, benchmark=benchmark)
        pools = self.evaluation.pools
        members = pool_problems(
            self.problems,
            pool,
            benchmark=benchmark,
            held_out=pools.held_out,
            tuning=pools.tuning,
        )
        return subset(members, count, seed)


@dataclass(frozen=True)
class Observation:
    """What the policy sees before a step."""

    text: str
    admissible_actions: tuple[str, ...]
    """Canonical admissible actions (listed in choice and text modes)."""
    anchor: str
    """Canonical hash of the workflow the next step modifies (GiGPO's anchor state)."""
    mode: ActionMode
    in_tree: tuple[int | None, ...] = ()
    """Per admissible action, the tree node of the workflow it makes when the tree already
    holds it (taking it is a duplicate), else None."""


@dataclass(frozen=True)
class EvaluationSummary:
    """An evaluation in brief (fresh cost and tokens: what this evaluation spent)."""

    mean: float
    std: float
    num_problems: int
    repeats: int
    executor_calls: int
    cache_hits: int
    cost_usd: float | None
    prompt_tokens: int
    completion_tokens: int
    wall_s: float

    @staticmethod
    def of(result: EvaluationResult) -> EvaluationSummary:
        return EvaluationSummary(
            mean=result.score_mean,
            std=result.score_std,
            num_problems=len(result.problems),
            repeats=result.repeats,
            executor_calls=result.executor_calls,
            cache_hits=result.cache_hits,
            cost_usd=result.fresh_cost_usd,
            prompt_tokens=sum(s.fresh.usage.prompt_tokens for s in result.samples),
            completion_tokens=sum(s.fresh.usage.completion_tokens for s in result.samples),
            wall_s=result.wall_s,
        )


@dataclass(frozen=True)
class _Spent:
    """What the evaluations of one step spent, added up."""

    executor_calls: int = 0
    cache_hits: int = 0
    cost_usd: float | None = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def plus(self, summary: EvaluationSummary | _Spent) -> _Spent:
        cost = (
            None
            if self.cost_usd is None or summary.cost_usd is None
            else self.cost_usd + summary.cost_usd
        )
        return _Spent(
            self.executor_calls + summary.executor_calls,
            self.cache_hits + summary.cache_hits,
            cost,
            self.prompt_tokens + summary.prompt_tokens,
            self.completion_tokens + summary.completion_tokens,
        )


@dataclass(frozen=True)
class StepInfo:
    """Details of one step (the environment service's ``StepInfo``)."""

    step_index: int
    valid_action: bool
    invalid_reason: str
    canonical_action: str
    parent_index: int
    parent_score: float
    child_index: int | None
    """Tree node the step led to (None when invalid)."""
    child_score: float
    child_hash: str
    best_score: float
    duplicate: bool
    executor_calls: int
    cache_hits: int
    cost_usd: float | None
    """Cost the step spent (None when a price is unknown)."""
    prompt_tokens: int
    completion_tokens: int
    done_reason: str
    best_gain: float = 0.0
    """The episode's best score among the workflows it added minus the seed's, after the step
    (:attr:`aflowrl.search.state.EpisodeState.best_gain`)."""
    raced: bool = False
    """The child was raced out: ``child_score`` is a partial mean (see the module docs)."""
    resampled_reward: float | None = None
    """The same reward measured on executor samples R..2R-1 (``evaluation.resampleFraction``
    of new children; None for the others)."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class StepOutcome:
    state: EpisodeState
    observation: Observation
    reward: float
    done: bool
    info: StepInfo


@dataclass(frozen=True)
class ResetOutcome:
    state: EpisodeState
    observation: Observation
    seed_evaluation: EvaluationSummary


# ---------------------------------------------------------------------------------- helpers
def _wrong(result: EvaluationResult, limit: int) -> tuple[WrongRun, ...]:
    """Up to ``limit`` distinct problems the workflow got wrong, worst first."""
    chosen: list[WrongRun] = []
    seen: set[str] = set()
    for problem, sample in result.wrong():
        if problem.problem_id in seen:
            continue
        seen.add(problem.problem_id)
        produced = sample.answer.strip()
        if sample.detail:
            produced = f"{produced} [{sample.detail.strip()}]"
        chosen.append(
            WrongRun(
                problem_id=problem.problem_id,
                sample=sample.sample,
                score=sample.score,
                produced=produced[:PRODUCED_CHARS],
            )
        )
        if len(chosen) >= limit:
            break
    return tuple(chosen)


def _node(
    result: EvaluationResult,
    *,
    parent: int | None,
    action: str | None,
    graph: Graph | None,
    step: int,
    wrong_limit: int,
) -> TreeNode:
    return TreeNode(
        parent=parent,
        action=action,
        graph=graph.to_dict() if graph is not None else None,
        hash=result.workflow_hash,
        score=result.score_mean,
        std=result.score_std,
        calls=sum(s.llm_calls for s in result.samples),
        cost_usd=result.cost_usd,
        step=step,
        wrong=_wrong(result, wrong_limit),
        raced_after=None if result.raced is None else result.raced.scored,
        bound=None if result.raced is None else result.raced.bound,
    )


def _reward(spec: SearchSpec, child_score: float, base: float) -> float:
    """The step reward of a new child scoring ``child_score`` against ``base``."""
    if spec.reward == "improvement":
        return max(0.0, child_score - base)
    return child_score - base


def _resampling(ctx: SearchContext, state: EpisodeState, child_hash: str) -> bool:
    """Whether this step's reward is measured again (a stable draw, the same on a retry)."""
    fraction = ctx.evaluation.resample_fraction
    if fraction <= 0.0:
        return False
    draw = derive_seed("resample", state.seed, state.step, child_hash) / float(2**31 - 1)
    return draw < fraction


async def _resampled_reward(
    ctx: SearchContext,
    state: EpisodeState,
    base_graph: Graph,
    child: Graph,
    problems: Sequence[Problem],
) -> tuple[float, _Spent]:
    """The reward of ``child`` against ``base_graph`` on samples R..2R-1 (module docs)."""
    repeats = state.repeats
    spent = _Spent()
    later: list[float] = []
    for graph in (base_graph, child):  # the base first: the child reuses its draws
        result = await ctx.evaluator.evaluate(graph, problems, repeats=2 * repeats)
        spent = spent.plus(EvaluationSummary.of(result))
        later.append(
            math.fsum(s.score for p in result.problems for s in p.samples[repeats:])
            / (len(result.problems) * repeats)
        )
    return _reward(state.search, later[1], later[0]), spent


async def _score_in_full(
    ctx: SearchContext,
    state: EpisodeState,
    nodes: list[TreeNode],
    index: int,
    problems: Sequence[Problem],
) -> EvaluationSummary:
    """Finish the evaluation of raced node ``index`` in ``nodes`` (the problems it already
    scored come from the cache) and replace it by its full record."""
    node = nodes[index]
    result = await ctx.evaluator.evaluate(graph_at(state, index), problems, repeats=state.repeats)
    full = _node(
        result,
        parent=node.parent,
        action=node.action,
        graph=graph_at(state, index) if node.graph is not None else None,
        step=node.step,
        wrong_limit=state.search.failed_examples,
    )
    nodes[index] = full
    return EvaluationSummary.of(result)


def _race(state: EpisodeState, child: Graph, target: float) -> Race | None:
    """How a new child is raced (None: racing off)."""
    racing = state.racing
    if not racing.enabled:
        return None
    seed = derive_seed(state.seed, "race", child.content_hash)
    return Race(target=target, delta=racing.delta, batch=racing.batch, seed=seed)


def _top_mean(nodes: Sequence[TreeNode], k: int) -> float:
    scores = sorted((n.score for n in nodes), reverse=True)[:k]
    return math.fsum(scores) / len(scores)


def _require_values(search: SearchSpec, ctx: SearchContext) -> None:
    if search.selection == "fused" and ctx.values is None:
        raise InvalidInputError(
            "fused selection needs a value source (a critic, anchor-mc values or a callable); "
            "none was given",
            field="search.valueSource",
        )


async def _select(ctx: SearchContext, state: EpisodeState, step: int) -> int:
    spec = state.search
    stats = [
        selection.NodeStats(n.score, state.visits(i), is_root=i == 0)
        for i, n in enumerate(state.nodes)
    ]
    if spec.selection == "aflow":
        rng = random.Random(derive_seed(state.seed, "select", step))
        return selection.sample_aflow(
            stats, rng, alpha=spec.aflow.alpha, lambda_=spec.aflow.lambda_, top_k=spec.aflow.top_k
        )
    ucb = selection.ucb_scores(stats, spec.ucb_c)
    if spec.selection == "ucb":
        return selection.argmax(ucb)
    _require_values(spec, ctx)
    assert ctx.values is not None
    queries = [
        ValueQuery(
            n.hash,
            graph_at(state, i),
            n.score,
            stats[i].visits,
            tuple(state.nodes[a].hash for a in state.ancestors(i)),
        )
        for i, n in enumerate(state.nodes)
    ]
    values = list(await ctx.values(queries))
    if len(values) != len(queries) or not all(math.isfinite(v) for v in values):
        raise InvalidInputError(
            f"the value source gave {len(values)} values (finite ones needed) for "
            f"{len(queries)} workflows",
            field="values",
        )
    return selection.argmax(selection.fused_scores(ucb, values, spec.fused_w))


def _listed(state: EpisodeState, graph: Graph) -> Sequence[Candidate]:
    """The actions listed at ``graph``: without those leading to a workflow the tree holds when
    ``search.listDuplicates`` is off (unless every one does)."""
    exclude = (
        frozenset()
        if state.search.list_duplicates
        else frozenset(node.hash for node in state.nodes)
    )
    return admissible_actions(graph, state.search.max_admissible_actions, exclude=exclude)


def observe(ctx: SearchContext, state: EpisodeState) -> Observation:
    """The observation of ``state`` (the workflow its next step modifies)."""
    graph = graph_at(state, state.parent)
    listed = _listed(state, graph)
    texts = tuple(c.text for c in listed)
    in_tree = tuple(state.index_of(c.child.content_hash) for c in listed)
    text = render_observation(
        ObservationInput(
            benchmark=state.benchmark,
            state=state,
            graph=graph,
            mode=state.search.action_mode,
            listed=texts,
            problems=ctx.problems_by_id,
            in_tree=in_tree,
        ),
        state.search.max_observation_chars,
    )
    return Observation(text, texts, graph.content_hash, state.search.action_mode, in_tree)


def _check(ctx: SearchContext, state: EpisodeState) -> list[Problem]:
    """The episode's problems; raises when the state belongs to another environment."""
    benchmark = ctx.evaluator.benchmark.name
    if state.benchmark != benchmark:
        raise EpisodeStateError(
            f"the episode is on {state.benchmark}; this environment serves {benchmark}",
            field="state.benchmark",
        )
    if state.executor != ctx.executor_key:
        raise EpisodeStateError(
            f"the episode was scored with executor {state.executor!r}; this environment uses "
            f"{ctx.executor_key!r}",
            field="state.executor",
        )
    problems = ctx.episode_problems(state.seed, state.problem_count, state.pool)
    if problems_digest(problems) != state.problems:
        raise EpisodeStateError(
            "the episode's problems differ from this environment's (another data set?)",
            field="state.problems",
        )
    return problems


# ---------------------------------------------------------------------------------- API
async def reset(
    ctx: SearchContext,
    *,
    seed: int,
    episode_id: str = "",
    seed_workflow: Graph | None = None,
    max_steps: int | None = None,
    action_mode: ActionMode | None = None,
    pool: PoolName = "all",
) -> ResetOutcome:
    """Start an episode: evaluate the seed workflow and observe it; its problems are the
    subset seed ``seed`` chooses in problem pool ``pool``
    (:meth:`SearchContext.episode_problems`)."""
    benchmark = ctx.evaluator.benchmark
    graph = seed_workflow or library.load("seed", benchmark.task_type)
    if graph.task_type != benchmark.task_type:
        raise InvalidInputError(
            f"the seed workflow is for {graph.task_type} tasks; {benchmark.name} is "
            f"{benchmark.task_type}",
            field="seed_workflow",
        )
    if seed < 0:
        raise InvalidInputError(f"{seed} is negative", field="seed")
    overrides: dict[str, Any] = {}
    if max_steps:
        overrides["max_steps"] = max_steps
    if action_mode is not None:
        overrides["action_mode"] = action_mode
    search = SearchSpec.model_validate(ctx.search.model_copy(update=overrides).model_dump())
    _require_values(search, ctx)
    conflict = racing_conflict(search, ctx.evaluation)
    if conflict is not None:
        raise InvalidInputError(conflict, field="evaluation.racing.enabled")
    problems = ctx.episode_problems(seed, ctx.evaluation.max_problems, pool)
    result = await ctx.evaluator.evaluate(graph, problems, repeats=ctx.evaluation.repeats)
    root = _node(
        result, parent=None, action=None, graph=graph, step=0, wrong_limit=search.failed_examples
    )
    state = EpisodeState(
        version=STATE_VERSION,
        episode_id=episode_id,
        benchmark=benchmark.name,
        task_type=benchmark.task_type,
        split="test" if pool == "test" else ctx.evaluation.split,
        executor=ctx.executor_key,
        problems=problems_digest(problems),
        problem_count=len(problems),
        pool=pool,
        repeats=ctx.evaluation.repeats,
        seed=seed,
        search=search,
        racing=ctx.evaluation.racing,
        step=0,
        parent=0,
        nodes=(root,),
        top_mean=root.score,
    )
    state = state.model_copy(update={"parent": await _select(ctx, state, 0)})
    return ResetOutcome(state, observe(ctx, state), EvaluationSummary.of(result))


def project_action(ctx: SearchContext, state: EpisodeState, action: str) -> Projection:
    """Where ``action`` lands on the state's parent, without evaluating anything."""
    _check(ctx, state)
    graph = graph_at(state, state.parent)
    return project(action, graph, mode=state.search.action_mode, listed=_listed(state, graph))


async def step(ctx: SearchContext, state: EpisodeState, action: str) -> StepOutcome:
    """Apply ``action`` to the state's parent, evaluate the child, select the next parent."""
    problems = _check(ctx, state)
    if state.done:
        raise EpisodeOverError(f"the episode is over ({state.done_reason})")
    spec = state.search
    _require_values(spec, ctx)
    nodes = list(state.nodes)
    spent = _Spent()
    if nodes[state.parent].raced:
        spent = spent.plus(await _score_in_full(ctx, state, nodes, state.parent, problems))
    parent = nodes[state.parent]
    graph = graph_at(state, state.parent)
    projection = project(action, graph, mode=spec.action_mode, listed=_listed(state, graph))
    base_index = (
        state.parent
        if spec.reward == "delta-parent"
        else max(range(len(nodes)), key=lambda i: nodes[i].score)
    )
    base = nodes[base_index].score
    duplicate = False
    raced = False
    resampled_reward: float | None = None
    child_index: int | None = None
    if not projection.valid:
        attempt = Attempt(
            step=state.step,
            parent=state.parent,
            action=action.strip()[:ACTION_CHARS_INVALID],
            valid=False,
            reason=projection.reason[:2000],
        )
        reward = 0.0
    else:
        child = projection.child
        assert child is not None
        child_index = state.index_of(child.content_hash)
        duplicate = child_index is not None
        if child_index is not None and nodes[child_index].raced:
            spent = spent.plus(await _score_in_full(ctx, state, nodes, child_index, problems))
        if child_index is None:
            result = await ctx.evaluator.evaluate(
                child, problems, repeats=state.repeats, race=_race(state, child, base)
            )
            spent = spent.plus(EvaluationSummary.of(result))
            raced = result.raced is not None
            freeform = projection.graph_json is not None
            nodes.append(
                _node(
                    result,
                    parent=state.parent,
                    action=None if freeform else projection.action,
                    graph=child if freeform else None,
                    step=state.step + 1,
                    wrong_limit=spec.failed_examples,
                )
            )
            child_index = len(nodes) - 1
        # A workflow the tree already holds earns no improvement, and the wasted step costs
        # search.duplicatePenalty (AFlow refuses repeated modifications).
        if duplicate:
            reward = -spec.duplicate_penalty
        else:
            reward = _reward(spec, nodes[child_index].score, base)
            if (
                not raced
                and not nodes[base_index].raced
                and _resampling(ctx, state, child.content_hash)
            ):
                resampled_reward, extra = await _resampled_reward(
                    ctx, state, graph_at(state, base_index), child, problems
                )
                spent = spent.plus(extra)
        attempt = Attempt(
            step=state.step,
            parent=state.parent,
            action=projection.action,
            valid=True,
            child=child_index,
            duplicate=duplicate,
            reward=reward,
        )
    top_mean = _top_mean(nodes, spec.convergence_top_k)
    stale = state.stale + 1 if abs(top_mean - state.top_mean) <= _SAME else 0
    new_step = state.step + 1
    done_reason = ""
    if new_step >= spec.max_steps:
        done_reason = "max_steps"
    elif spec.convergence_rounds and stale >= spec.convergence_rounds:
        done_reason = "converged"
    next_state = state.model_copy(
        update={
            "step": new_step,
            "nodes": tuple(nodes),
            "attempts": (*state.attempts, attempt),
            "stale": stale,
            "top_mean": top_mean,
            "done": bool(done_reason),
            "done_reason": done_reason,
        }
    )
    next_state = next_state.model_copy(update={"parent": await _select(ctx, next_state, new_step)})
    shown = nodes[child_index] if child_index is not None else parent
    info = StepInfo(
        step_index=state.step,
        valid_action=projection.valid,
        invalid_reason=projection.reason,
        canonical_action=projection.action,
        parent_index=state.parent,
        parent_score=parent.score,
        child_index=child_index,
        child_score=shown.score,
        child_hash=shown.hash,
        best_score=next_state.best_score,
        duplicate=duplicate,
        executor_calls=spent.executor_calls,
        cache_hits=spent.cache_hits,
        cost_usd=spent.cost_usd,
        prompt_tokens=spent.prompt_tokens,
        completion_tokens=spent.completion_tokens,
        done_reason=done_reason,
        best_gain=next_state.best_gain,
        raced=raced,
        resampled_reward=resampled_reward,
    )
    return StepOutcome(next_state, observe(ctx, next_state), reward, next_state.done, info)
