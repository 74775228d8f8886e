"""Value sources for ``fused`` selection: V(s) of a workflow state, from a critic or from returns.

A value source is an async callable that takes the tree's workflows (:class:`ValueQuery`: anchor
hash, graph, score, visits) and returns one value per workflow, in return units (the sum of
step rewards an episode collects from that state on). Three kinds:

* a critic: any callable, e.g. the trainer's wrapper around the learner's value head;
* :class:`AnchorMonteCarlo`: the mean return observed from each anchor state (GiGPO's anchor
  is the canonical hash of the workflow a step modifies), a table the caller fills with
  :meth:`AnchorMonteCarlo.record` and can carry as JSON;
* :class:`StaticValues`: a fixed mapping (what a caller sends along with a request: the
  trainer's table of the policy's own values, or of a critic's).

A table knows only the workflows it has seen; a workflow it has no value for takes the value
of its nearest ancestor that it has (a child just made has not been observed yet, and its
parent's value is the best prior at hand), then the table's prior / default.

Used by :mod:`aflowrl.search.episode` (``SearchContext.values``), ``aflowrl optimize`` and the
trainer.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aflowrl.errors import InvalidInputError
from aflowrl.workflow import Graph


@dataclass(frozen=True)
class ValueQuery:
    """One workflow of the tree whose value selection needs."""

    anchor: str
    """Canonical content hash of the workflow."""
    graph: Graph
    score: float
    """Its mean validation score in [0, 1]."""
    visits: int
    ancestors: tuple[str, ...] = ()
    """Hashes of its parent, grandparent, ... up to the seed: a table that has no value for
    the workflow itself uses its nearest valued ancestor's (a child just made has not been
    observed yet; its parent's value is the best prior the table has)."""

    def lookup(self) -> tuple[str, ...]:
        """The anchors to look up, nearest first: the workflow's own, then its ancestors'."""
        return (self.anchor, *self.ancestors)


class ValueSource(Protocol):
    """``await source(queries)`` gives one value per query, in order."""

    def __call__(self, queries: Sequence[ValueQuery]) -> Awaitable[Sequence[float]]: ...


class AnchorMonteCarlo:
    """V(s) = mean of the returns recorded for anchor s (``prior`` when none is recorded).

    The running mean is kept as (count, sum), so tables from several workers merge exactly
    (:meth:`merge`).
    """

    def __init__(self, prior: float = 0.0) -> None:
        if not math.isfinite(prior):
            raise InvalidInputError(f"{prior} is not finite", field="prior")
        self.prior = prior
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}

    def record(self, anchor: str, value: float) -> None:
        """Add one observed return from ``anchor``."""
        if not math.isfinite(value):
            raise InvalidInputError(f"{value} is not finite", field="return")
        self._sums[anchor] = self._sums.get(anchor, 0.0) + value
        self._counts[anchor] = self._counts.get(anchor, 0) + 1

    def value(self, anchor: str) -> float:
        count = self._counts.get(anchor, 0)
        return self._sums[anchor] / count if count else self.prior

    def value_of(self, query: ValueQuery) -> float:
        """The value of the nearest recorded anchor of ``query`` (itself, then ancestors)."""
        for anchor in query.lookup():
            if self._counts.get(anchor, 0):
                return self.value(anchor)
        return self.prior

    def count(self, anchor: str) -> int:
        return self._counts.get(anchor, 0)

    def merge(self, other: AnchorMonteCarlo) -> None:
        for anchor, total in other._sums.items():
            self._sums[anchor] = self._sums.get(anchor, 0.0) + total
            self._counts[anchor] = self._counts.get(anchor, 0) + other._counts[anchor]

    async def __call__(self, queries: Sequence[ValueQuery]) -> Sequence[float]:
        return [self.value_of(q) for q in queries]

    def to_dict(self) -> dict[str, Any]:
        return {
            "prior": self.prior,
            "anchors": {a: [self._counts[a], self._sums[a]] for a in sorted(self._sums)},
        }

    @staticmethod
    def from_dict(doc: Mapping[str, Any]) -> AnchorMonteCarlo:
        try:
            table = AnchorMonteCarlo(float(doc.get("prior", 0.0)))
            for anchor, (count, total) in dict(doc.get("anchors", {})).items():
                if int(count) < 1:
                    raise ValueError(f"count {count} of {anchor!r} is not positive")
                table._counts[str(anchor)] = int(count)
                table._sums[str(anchor)] = float(total)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"not an anchor table: {exc}", field="values") from None
        return table


class StaticValues:
    """Values from a fixed mapping anchor -> value: a workflow absent from it takes its nearest
    ancestor's value, ``default`` when none of them is there."""

    def __init__(self, values: Mapping[str, float], default: float = 0.0) -> None:
        self.values = dict(values)
        self.default = default

    def value_of(self, query: ValueQuery) -> float:
        for anchor in query.lookup():
            if anchor in self.values:
                return self.values[anchor]
        return self.default

    async def __call__(self, queries: Sequence[ValueQuery]) -> Sequence[float]:
        return [self.value_of(q) for q in queries]
