"""The episode state: the tree of evaluated workflows, what was tried, and where the search is.

An :class:`EpisodeState` is immutable and round-trips through compact JSON
(:meth:`EpisodeState.to_json` / :meth:`EpisodeState.from_json`), so the caller can carry it
between steps and any environment replica can serve the next one. It holds:

* the episode's identity and settings (benchmark, executor id, digest of the problems scored,
  seed, the :class:`~aflowrl.config.SearchSpec` in force, repeats), so a replica configured
  differently refuses the state rather than silently changing the episode;
* the tree (:class:`TreeNode`): the seed workflow in full, each child as its parent and the
  canonical action that made it (free-form children in full), with its score, spread, cost,
  executor calls and a few problems it got wrong;
* every attempt (:class:`Attempt`), valid or not, which is the experience the policy sees;
* the step index, the parent the next step modifies, and the convergence counter. Randomness
  is derived from (seed, step), so no generator state is stored.

Graphs are rebuilt by replaying actions from the seed (:func:`graph_at`), and each rebuilt
graph must have the content hash stored for it: a state from another version of the action
language is refused, never misread.

Used by :mod:`aflowrl.search.episode`, ``aflowrl optimize`` (its run directory) and the
environment service (which wraps the JSON in its versioned, integrity-checked blob).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from aflowrl import documents
from aflowrl.benchmarks.base import Problem, TaskType
from aflowrl.config import SearchSpec
from aflowrl.config.environment import PoolName, RacingSpec
from aflowrl.search.actions import parse_action
from aflowrl.search.edits import apply_action
from aflowrl.search.errors import EpisodeStateError, InvalidActionError
from aflowrl.workflow import Graph, WorkflowValidationError

STATE_VERSION: Final = 1
"""Version of the JSON form; a state of another version is refused."""
MAX_STATE_CHARS: Final = 64 << 20
"""Largest state JSON read (the environment's blobs decompress to at most this)."""

PRODUCED_CHARS: Final = 400
"""Longest answer kept per wrong problem."""
ACTION_CHARS_INVALID: Final = 300
"""Longest invalid action text kept in the experience (hostile texts do not bloat the state)."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=False)


class WrongRun(_Model):
    """A problem the workflow got wrong (what the observation shows)."""

    problem_id: str = Field(max_length=512)
    sample: int = Field(ge=0)
    score: float = Field(ge=0.0, le=1.0)
    produced: str = Field(max_length=PRODUCED_CHARS + 64)


class TreeNode(_Model):
    """One evaluated workflow of the tree."""

    parent: int | None = Field(ge=0)
    """Index of the parent node; None for the seed workflow."""
    action: str | None = Field(default=None, max_length=20_000)
    """Canonical action that made this node from its parent (None: the seed, free-form)."""
    graph: dict[str, Any] | None = None
    """The graph in JSON form when it is not an action's result (the seed, free-form)."""
    hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    score: float = Field(ge=0.0, le=1.0)
    std: float = Field(ge=0.0)
    calls: int = Field(ge=0)
    """Executor calls one full evaluation of this workflow takes (cache hits included)."""
    cost_usd: float | None = None
    """Cost of one full evaluation (None when a price is unknown)."""
    step: int = Field(ge=0)
    """The step that created it (0 for the seed; k for the child of step k-1)."""
    wrong: tuple[WrongRun, ...] = ()
    raced_after: int | None = Field(default=None, ge=1)
    """Set when racing stopped its evaluation: the problems scored by then. ``score``, ``std``,
    ``calls`` and ``cost_usd`` are then those of the partial evaluation (the score a partial
    mean, below ``bound``); it is scored in full before anything is measured against it."""
    bound: float | None = Field(default=None, ge=0.0, le=1.0)
    """With ``raced_after``: upper confidence bound on the full score when racing stopped it."""

    @property
    def raced(self) -> bool:
        return self.raced_after is not None


class Attempt(_Model):
    """One step: the action tried on a parent and what came of it."""

    step: int = Field(ge=0)
    parent: int = Field(ge=0)
    action: str = Field(max_length=20_000)
    """Canonical action (the response itself, clipped, when invalid)."""
    valid: bool
    reason: str = Field(default="", max_length=2000)
    child: int | None = Field(default=None, ge=0)
    """Node the action led to (a new one, or an existing one when a duplicate)."""
    duplicate: bool = False
    reward: float = 0.0


class EpisodeState(_Model):
    """One optimisation episode, as the caller carries it between steps."""

    version: Literal[1]
    episode_id: str = Field(default="", max_length=256)
    benchmark: str = Field(max_length=64)
    task_type: TaskType
    split: str = Field(max_length=32)
    executor: str = Field(max_length=1024)
    """Executor id and settings of the evaluator (part of the evaluation cache key)."""
    problems: str = Field(pattern=r"^[0-9a-f]{16}$")
    """Digest of the ids of the problems each workflow is scored on."""
    problem_count: int = Field(ge=1)
    pool: PoolName = "all"
    """The problem pool the problems were drawn from (``evaluation.pools``)."""
    repeats: int = Field(ge=1)
    seed: int = Field(ge=0)
    search: SearchSpec
    racing: RacingSpec = Field(default_factory=RacingSpec)
    """Racing of new children (off: each is scored on every problem)."""
    step: int = Field(ge=0)
    """Steps taken so far."""
    parent: int = Field(ge=0)
    """Node the next step modifies."""
    nodes: tuple[TreeNode, ...] = Field(min_length=1)
    attempts: tuple[Attempt, ...] = ()
    stale: int = Field(default=0, ge=0)
    """Consecutive steps after which the top-k mean score did not change."""
    top_mean: float = 0.0
    """Mean score of the top-k workflows (k: ``search.convergence_top_k``)."""
    done: bool = False
    done_reason: str = ""

    # ------------------------------------------------------------------ reading
    @property
    def best(self) -> int:
        """Index of the best-scoring node (ties: the earliest)."""
        return max(range(len(self.nodes)), key=lambda i: (self.nodes[i].score, -i))

    @property
    def best_score(self) -> float:
        return self.nodes[self.best].score

    @property
    def best_gain(self) -> float:
        """The episode's headline: the best score among the workflows the episode added (every
        node but the seed; duplicates add none) minus the seed's; 0 while it added none."""
        if len(self.nodes) == 1:
            return 0.0
        return max(n.score for n in self.nodes[1:]) - self.nodes[0].score

    def ancestors(self, index: int) -> list[int]:
        """Indices of node ``index``'s parent, its parent's parent, ... up to the seed."""
        out: list[int] = []
        parent = self.nodes[index].parent
        while parent is not None:
            out.append(parent)
            parent = self.nodes[parent].parent
        return out

    def visits(self, index: int) -> int:
        """1 for the node's evaluation plus 1 per step that modified it."""
        return 1 + sum(1 for a in self.attempts if a.parent == index)

    def index_of(self, content_hash: str) -> int | None:
        return next((i for i, n in enumerate(self.nodes) if n.hash == content_hash), None)

    def tried_from(self, index: int) -> list[Attempt]:
        return [a for a in self.attempts if a.parent == index]

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> str:
        """Compact JSON (defaults left out, except in the search settings)."""
        doc = self.model_dump(mode="json", exclude_defaults=True)
        doc["version"] = self.version
        # The settings in full: a later release with other defaults must not reinterpret them.
        doc["search"] = self.search.model_dump(mode="json")
        if self.racing.enabled:
            doc["racing"] = self.racing.model_dump(mode="json")
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)

    def to_bytes(self) -> bytes:
        return self.to_json().encode()

    @staticmethod
    def from_json(text: str | bytes) -> EpisodeState:
        """Parse and check a state; raises :class:`EpisodeStateError` naming the field."""
        try:
            doc = documents.load_json(text, source="state", max_chars=MAX_STATE_CHARS)
        except documents.DocumentError as exc:
            raise EpisodeStateError(exc.reason, field="state") from None
        if not isinstance(doc, dict):
            raise EpisodeStateError("must be a JSON object", field="state")
        if doc.get("version") != STATE_VERSION:
            raise EpisodeStateError(
                f"version {doc.get('version')!r}; this environment reads {STATE_VERSION}",
                field="state.version",
            )
        try:
            state = EpisodeState.model_validate(doc)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
            raise EpisodeStateError(first["msg"], field=f"state{where}") from None
        state.check_consistency()
        return state

    def check_consistency(self) -> None:
        """Indices point where they should; raises :class:`EpisodeStateError`."""
        if self.nodes[0].parent is not None or self.nodes[0].graph is None:
            raise EpisodeStateError("the first node must be the seed workflow", field="state.nodes")
        for i, node in enumerate(self.nodes[1:], start=1):
            if node.parent is None or node.parent >= i:
                raise EpisodeStateError("parent must be an earlier node", field=f"state.nodes[{i}]")
            if (node.action is None) == (node.graph is None):
                raise EpisodeStateError(
                    "needs exactly one of action and graph", field=f"state.nodes[{i}]"
                )
        if self.parent >= len(self.nodes):
            raise EpisodeStateError(f"no node {self.parent}", field="state.parent")
        for i, attempt in enumerate(self.attempts):
            if attempt.parent >= len(self.nodes) or (
                attempt.child is not None and attempt.child >= len(self.nodes)
            ):
                raise EpisodeStateError("points past the tree", field=f"state.attempts[{i}]")
        if len(self.attempts) != self.step:
            raise EpisodeStateError(
                f"{len(self.attempts)} attempts after {self.step} steps", field="state.step"
            )


def problems_digest(problems: Sequence[Problem]) -> str:
    """A short digest of the problem ids (order matters)."""
    joined = "\n".join(f"{p.benchmark}/{p.problem_id}" for p in problems)
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


@lru_cache(maxsize=1024)
def _from_json_text(text: str) -> Graph:
    return Graph.from_json(text, source="state")


@lru_cache(maxsize=4096)
def _replay(parent: Graph, action: str) -> Graph:
    return apply_action(parent, parse_action(action))


def graph_at(state: EpisodeState, index: int) -> Graph:
    """The graph of node ``index``, rebuilt from the seed and checked against its hash."""
    chain = []
    current: int | None = index
    while current is not None:
        chain.append(current)
        node = state.nodes[current]
        if node.graph is not None:
            break
        current = node.parent
    graph: Graph | None = None
    for i in reversed(chain):
        node = state.nodes[i]
        try:
            if node.graph is not None:
                graph = _from_json_text(json.dumps(node.graph, sort_keys=True))
            else:
                assert graph is not None and node.action is not None
                graph = _replay(graph, node.action)
        except (WorkflowValidationError, InvalidActionError) as exc:
            raise EpisodeStateError(f"does not rebuild: {exc}", field=f"state.nodes[{i}]") from None
        if graph.content_hash != node.hash:
            raise EpisodeStateError(
                "rebuilds to a different workflow (a state from another version?)",
                field=f"state.nodes[{i}]",
            )
    assert graph is not None
    return graph
