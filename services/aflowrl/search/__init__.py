"""The tree search over workflows: edit actions, projection, selection, the episode, proposers.

AFlow's optimisation loop, rebuilt as the environment the RL policy acts in and usable on its
own (``aflowrl optimize``):

* :mod:`.actions`: the edit-action language (one detail per edit), parsed and written;
* :mod:`.edits`: applying actions to graphs and enumerating the admissible ones;
* :mod:`.projection`: mapping the policy's text onto an admissible action, or invalid;
* :mod:`.selection`: the ``aflow``, ``ucb`` and ``fused`` parent-selection rules;
* :mod:`.values`: value sources for ``fused`` (critic callables, anchor Monte-Carlo);
* :mod:`.state`: the immutable, JSON-serialisable episode state (the tree and experience);
* :mod:`.observation`: the bounded text the policy reads;
* :mod:`.episode`: ``reset`` / ``step`` / ``project_action``, the deterministic state machine;
* :mod:`.proposers` (and :mod:`.policy`, which needs torch): who writes the edits;
* :mod:`.optimize`, :mod:`.rundir`: the resumable ``aflowrl optimize`` loop and its files.

Typical use (the environment service does the same over gRPC)::

    from aflowrl.search import SearchContext, reset, step
    ctx = SearchContext(evaluator, problems, search=spec.environment.search)
    start = await reset(ctx, seed=0)
    outcome = await step(ctx, start.state, "<action>1</action>")
"""

from aflowrl.search.actions import GRAMMAR, EditAction, parse_action
from aflowrl.search.edits import Candidate, admissible_actions, apply_action
from aflowrl.search.episode import (
    EvaluationSummary,
    Observation,
    ResetOutcome,
    SearchContext,
    StepInfo,
    StepOutcome,
    observe,
    project_action,
    reset,
    step,
)
from aflowrl.search.errors import (
    EpisodeOverError,
    EpisodeStateError,
    InvalidActionError,
    ProposerUnavailableError,
)
from aflowrl.search.projection import ActionMode, Projection, project
from aflowrl.search.state import EpisodeState, graph_at
from aflowrl.search.values import AnchorMonteCarlo, StaticValues, ValueQuery, ValueSource

__all__ = [
    "GRAMMAR",
    "ActionMode",
    "AnchorMonteCarlo",
    "Candidate",
    "EditAction",
    "EpisodeOverError",
    "EpisodeState",
    "EpisodeStateError",
    "EvaluationSummary",
    "InvalidActionError",
    "Observation",
    "Projection",
    "ProposerUnavailableError",
    "ResetOutcome",
    "SearchContext",
    "StaticValues",
    "StepInfo",
    "StepOutcome",
    "ValueQuery",
    "ValueSource",
    "admissible_actions",
    "apply_action",
    "graph_at",
    "observe",
    "parse_action",
    "project",
    "project_action",
    "reset",
    "step",
]
