"""Errors of the workflow package: invalid graphs, unusable operator output, failed evaluations.

Raised by :mod:`aflowrl.workflow.graph` (validation), the operators and the evaluator. A graph
error names the node and field, so the search can show the policy why its edit was rejected.
"""

from __future__ import annotations

from collections.abc import Sequence

from aflowrl.errors import InvalidInputError, PermanentError


class WorkflowValidationError(InvalidInputError):
    """A workflow graph is invalid. ``problems`` lists every ``(field, message)`` found.

    ``field`` paths read like ``nodes[1] 'ensemble' (ScEnsemble).params.votes``.
    """

    def __init__(self, problems: Sequence[tuple[str, str]], *, source: str | None = None) -> None:
        self.problems: tuple[tuple[str, str], ...] = tuple(problems)
        self.source = source
        first_field, first_message = self.problems[0]
        if len(self.problems) == 1:
            super().__init__(first_message, field=first_field)
        else:
            listing = "; ".join(f"{f}: {m}" for f, m in self.problems)
            super().__init__(f"{len(self.problems)} problems: {listing}", field=first_field)
        if source is not None and not str(self).startswith(f"{source}:"):
            self.args = (f"{source}: {self.args[0]}",)

    def within(self, source: str) -> WorkflowValidationError:
        """The same problems, the message naming ``source`` (the file they were read from)."""
        return WorkflowValidationError(self.problems, source=source)


class OperatorOutputError(PermanentError):
    """An operator could not use the model's output (no answer tag, no code, no letter...).

    The interpreter turns it into a failed run of that problem (scored 0 and logged); it never
    ends an evaluation.
    """

    def __init__(self, node: str, op: str, reason: str) -> None:
        self.node = node
        self.op = op
        self.reason = reason
        super().__init__(f"node {node!r} ({op}): {reason}")
