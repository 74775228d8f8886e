"""The workflows an iteration's episodes reached, rebuilt from the seed and the actions.

The environment's state blob is opaque to the trainer, but every step reports the workflow it
modified (the observation's anchor: a canonical hash), the admissible action it applied in
canonical form, and the child's hash. Starting from the seed workflow the trainer sends with
``Reset``, :class:`WorkflowBook` replays each valid step with the search's own edit functions
(:func:`aflowrl.search.edits.apply_action`, exactly what the environment ran) and keeps the
child only if its content hash equals the one the environment reported; so the best workflows
of the run can be saved and evaluated on the test split without asking the environment. A child
that does not rebuild (a free-form graph, another version of the action language) stays known by
its hash only, with a warning. Used by :mod:`aflowrl.trainer.loop`.
"""

from __future__ import annotations

import logging

from aflowrl.errors import InvalidInputError
from aflowrl.search.actions import parse_action
from aflowrl.search.edits import apply_action
from aflowrl.workflow import Graph, WorkflowValidationError

logger = logging.getLogger(__name__)


class WorkflowBook:
    """Graphs by canonical hash (module docstring)."""

    def __init__(self, seed: Graph) -> None:
        self.seed = seed
        self.graphs: dict[str, Graph] = {seed.content_hash: seed}
        self._warned: set[str] = set()

    def get(self, workflow_hash: str) -> Graph | None:
        return self.graphs.get(workflow_hash)

    def replay(self, anchor: str, canonical_action: str, child_hash: str) -> Graph | None:
        """The child of ``anchor`` under ``canonical_action``, checked against ``child_hash``."""
        if child_hash in self.graphs:
            return self.graphs[child_hash]
        parent = self.graphs.get(anchor)
        if parent is None or not canonical_action:
            return None
        try:
            child = apply_action(parent, parse_action(canonical_action))
        except (InvalidInputError, WorkflowValidationError) as exc:
            self._warn(child_hash, f"does not rebuild ({exc})")
            return None
        if child.content_hash != child_hash:
            self._warn(child_hash, f"rebuilds to {child.content_hash[:12]}")
            return None
        self.graphs[child_hash] = child
        return child

    def _warn(self, child_hash: str, why: str) -> None:
        if child_hash not in self._warned:
            self._warned.add(child_hash)
            logger.warning("workflow %s %s: kept by its hash only", child_hash[:12], why)
