"""What one iteration collects: episodes, their step rows, and the policy's decisions.

One *row* is one agent step: the observation the policy saw, its decision (a sampled response in
text mode, a chosen candidate in choice mode), the behaviour log-probabilities and the policy
version that produced them, and what the environment answered (reward, validity, anchor, scores).
A *group* is the ``trainer.groupSize`` episodes started from the same task seed (GiGPO's episode
group); ``traj`` numbers the episodes of the iteration. Built by :mod:`aflowrl.trainer.loop`,
read by :mod:`aflowrl.trainer.advantages` and the run records.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Observed:
    """What an actor needs of an active episode: the observation's text and listed actions (all
    a policy reads), and where the episode stands (for actors that look the state up: the
    references of ``bench/learning.py``)."""

    text: str
    admissible: tuple[str, ...]
    benchmark: str = ""
    anchor: str = ""
    """Hash of the workflow the step modifies."""
    workflow_json: str = ""
    """That workflow (aflowrl.workflow JSON); empty when unknown."""
    in_tree: tuple[int, ...] = ()
    """Per listed action, the tree node it leads to when the tree holds it (a duplicate), or
    -1."""
    state: bytes = b""
    """The episode's state blob (what a Step from here takes)."""
    seed: int = 0
    """The task seed."""
    pool: str = "all"
    """The task's problem pool."""


@dataclass(frozen=True)
class Decision:
    """The policy's output for one observation."""

    action: str
    """Text sent to the environment's Step."""
    prompt_ids: tuple[int, ...] = ()
    """Prompt tokens (chat template applied), as the rollout saw them."""
    response_ids: tuple[int, ...] = ()
    """Text mode: the generated tokens (the trained part)."""
    candidate_ids: tuple[tuple[int, ...], ...] = ()
    """Choice mode: each admissible action's continuation tokens, in listed order."""
    chosen: int = -1
    """Choice mode: index of the sampled candidate."""
    logprobs: tuple[float, ...] = ()
    """Behaviour log-probabilities: one per response token, or one (log pi(chosen))."""
    candidate_logprobs: tuple[float, ...] = ()
    """Choice mode: the behaviour log pi of every candidate, in listed order."""
    version: int = 0
    """Policy version that produced the decision."""
    value: float | None = None
    """The policy's V(s) of the observation (None: no value read)."""
    value_ids: tuple[tuple[int, ...], ...] = ()
    """Token ids of the value replies ``<value>0`` ... (trained towards the step's return)."""

    @property
    def is_choice(self) -> bool:
        return bool(self.candidate_ids)

    @property
    def width(self) -> int:
        """Values per training row: response tokens, or 1 for a choice."""
        return 1 if self.is_choice else len(self.response_ids)

    @property
    def trainable(self) -> bool:
        """Whether the decision can be a training row (it has something to score)."""
        return self.width > 0 and len(self.logprobs) == self.width


@dataclass
class StepRow:
    """One agent step."""

    traj: int
    """Episode index within the iteration."""
    group: int
    """Episode group (task seed) index within the iteration."""
    step: int
    """Step index within the episode."""
    anchor: str
    """Canonical hash of the workflow the step modified (GiGPO's anchor state)."""
    decision: Decision
    reward: float = 0.0
    """The environment's reward (no invalid-action penalty)."""
    valid: bool = True
    done: bool = False
    child_hash: str = ""
    child_score: float = 0.0
    parent_score: float = 0.0
    best_score: float = 0.0
    canonical_action: str = ""
    child_workflow_json: str = ""
    """The child workflow (aflowrl.workflow JSON) when the action was valid."""
    duplicate: bool = False
    best_gain: float = 0.0
    """The episode's best-gain after this step (best new workflow's score minus the seed's)."""
    executor_calls: int = 0
    cache_hits: int = 0
    cost_usd: float = 0.0
    cost_known: bool = True
    replica: str = ""
    """The environment replica that served the Step."""
    candidate_rewards: tuple[float, ...] = ()
    """GiGPO's sibling step groups: the reward of every listed action from this step's state
    (the chosen one's is ``reward``); empty when siblings are off."""
    candidate_children: tuple[str, ...] = ()
    """The workflow hash each listed action leads to (with ``candidate_rewards``)."""
    candidate_duplicates: tuple[bool, ...] = ()
    """Whether each listed action leads to a workflow the tree already held."""
    sibling_executor_calls: int = 0
    """Executor calls the siblings' Steps made (evaluations no episode had made)."""
    reward_pairs: tuple[tuple[float, float], ...] = ()
    """(reward, the same reward on other executor samples) of this Step and its siblings' Steps
    that the environment measured twice (``evaluation.resampleFraction``; :mod:`.noise`)."""


@dataclass
class Episode:
    """One optimisation episode and its rows."""

    traj: int
    group: int
    seed: int
    episode_id: str
    benchmark: str = ""
    """The task's benchmark (the Reset's ``task``)."""
    pool: str = "all"
    """The task's problem pool (``environment.evaluation.pools``)."""
    state: bytes = b""
    observation_text: str = ""
    admissible: tuple[str, ...] = ()
    anchor: str = ""
    in_tree: tuple[int, ...] = ()
    """Per listed action, the tree node it leads to when the tree holds it, else -1."""
    workflows: dict[str, str] = field(default_factory=dict)
    """Hash -> JSON of every workflow in the episode's tree (the seed's and each new child's)."""
    seed_score: float = 0.0
    done: bool = False
    rows: list[StepRow] = field(default_factory=list)

    @property
    def episode_return(self) -> float:
        """Undiscounted sum of the environment's rewards."""
        return math.fsum(r.reward for r in self.rows)

    @property
    def best_gain(self) -> float:
        """Best score among the workflows the episode added minus the seed's (0: none added)."""
        return self.rows[-1].best_gain if self.rows else 0.0

    @property
    def duplicates(self) -> int:
        """Steps into a workflow the tree already held."""
        return sum(1 for r in self.rows if r.duplicate)

    @property
    def best_score(self) -> float:
        """Best validation score in the episode's tree (the seed's when nothing was added)."""
        return max([self.seed_score, *(r.best_score for r in self.rows)])

    def observed(self) -> Observed:
        """What an actor sees of the episode now."""
        return Observed(
            self.observation_text,
            self.admissible,
            benchmark=self.benchmark,
            anchor=self.anchor,
            workflow_json=self.workflows.get(self.anchor, ""),
            in_tree=self.in_tree,
            state=self.state,
            seed=self.seed,
            pool=self.pool,
        )


@dataclass
class Batch:
    """Everything one iteration collected."""

    iteration: int
    episodes: list[Episode]

    @property
    def rows(self) -> list[StepRow]:
        return [row for episode in self.episodes for row in episode.rows]


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean; NaN for no values."""
    return math.fsum(values) / len(values) if values else math.nan


def std(values: Sequence[float]) -> float:
    """Population standard deviation; NaN for no values."""
    if not values:
        return math.nan
    m = mean(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / len(values))
