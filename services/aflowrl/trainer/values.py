"""V(s) for ``fused`` parent selection, which the trainer sends with every Reset and Step.

With ``environment.search.selection: fused`` the environment picks the next workflow to modify
by (1-w) UCB + w V(s) and keeps no value table of its own: the caller sends one
(``StateValues``: workflow hash -> V). The trainer keeps it from what it learns:

- ``policy`` (the default): the policy's own value estimate of each workflow state, read from
  the same rollout call that scores its actions (:mod:`aflowrl.search.encoding`): each time the
  policy observes a workflow as the one to modify, its value there replaces the table's entry
  (the newest policy's estimate);
- ``anchor-mc``: the mean return observed from each anchor state, the undiscounted sum of the
  rewards an episode collected from that step on (return units, as the search's value sources
  use), over every episode so far (:class:`aflowrl.search.AnchorMonteCarlo`);
- ``critic``: the learner's PPO value head at the last observation of each anchor (computed for
  the advantages anyway).

A workflow the table has no value for takes its nearest valued ancestor's on the environment's
side (:class:`aflowrl.search.StaticValues`); the default sent for the rest is the mean of the
known values (anchor-mc: its prior, 0). At most :data:`MAX_SENT` anchors are sent, those seen
most recently. The table is part of the trainer's checkpointed state. Used by
:mod:`aflowrl.trainer.collect` and the loop.

**What a request carries while episodes move independently.** Episodes of a collection do not
advance in lockstep, so "the table now" would depend on which episode's step returned first.
Instead, every Reset and Step of a collection carries the table as it was when the collection
started (:meth:`ValueTable.snapshot`) plus the values that episode itself observed since, newest
last (:class:`EpisodeValues`; only the ``policy`` source observes during a collection). A
request is then a function of its own episode's history and the previous iterations alone. When
the collection ends, the collector adds every episode's observations to the table in step order,
then episode order (:meth:`ValueTable.observe`), so the table is the same however the steps
interleaved.
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from aflowrl._proto.v1 import environment_pb2
from aflowrl.search import AnchorMonteCarlo
from aflowrl.trainer.rows import StepRow

MAX_SENT = 50_000
"""Anchors sent per request (the environment accepts 100,000)."""

ValueSourceName = Literal["policy", "anchor-mc", "critic"]


class ValueTable:
    """The values the trainer sends (module docstring)."""

    def __init__(self, source: ValueSourceName) -> None:
        self.source = source
        self.returns = AnchorMonteCarlo(prior=0.0)
        self.estimates: OrderedDict[str, float] = OrderedDict()
        """Latest estimate per anchor (``policy`` and ``critic``)."""
        self._recent: OrderedDict[str, None] = OrderedDict()

    @classmethod
    def empty(cls) -> ValueTable:
        """A table that stays empty: fused selection with it ranks by UCB alone (every V is the
        default 0), what a policy without values searches with."""
        return cls("anchor-mc")

    def _seen(self, anchor: str) -> None:
        self._recent[anchor] = None
        self._recent.move_to_end(anchor)
        while len(self._recent) > MAX_SENT:
            self._recent.popitem(last=False)

    def _estimate(self, anchor: str, value: float) -> None:
        if math.isfinite(value):
            self.estimates[anchor] = value
            self.estimates.move_to_end(anchor)
            self._seen(anchor)

    def observe(self, anchor: str, value: float | None) -> None:
        """The policy's value of ``anchor`` as it just observed it (``policy`` source)."""
        if self.source == "policy" and value is not None:
            self._estimate(anchor, value)

    def record(self, rows: Sequence[StepRow], critic_values: Sequence[float] | None = None) -> None:
        """Add an iteration's rows: return-to-go per anchor (anchor-mc), or the critic's V(s_t)."""
        if self.source == "critic":
            for row, value in zip(rows, critic_values or (), strict=False):
                self._estimate(row.anchor, value)
            return
        if self.source != "anchor-mc":
            return
        by_episode: dict[int, list[StepRow]] = {}
        for row in rows:
            by_episode.setdefault(row.traj, []).append(row)
        for episode in by_episode.values():
            to_go = 0.0
            for row in sorted(episode, key=lambda r: r.step, reverse=True):
                to_go += row.reward
                self.returns.record(row.anchor, to_go)
                self._seen(row.anchor)

    def snapshot(self) -> ValueTable:
        """A copy of the table as it is now (later changes to either do not reach the other)."""
        return copy.deepcopy(self)

    def proto(self, own: Mapping[str, float] | None = None) -> environment_pb2.StateValues:
        """The request field: the most recent anchors and the default for the rest; ``own``
        (an episode's own estimates, :class:`EpisodeValues`) replaces the table's entries and
        counts as the most recent."""
        anchors = list(self._recent)
        if own:
            anchors = [a for a in anchors if a not in own] + list(own)
            del anchors[:-MAX_SENT]
        if self.source == "anchor-mc":
            default = self.returns.prior
            values = {a: self.returns.value(a) for a in anchors}
        else:
            mine = own or {}
            values = {
                a: mine[a] if a in mine else self.estimates[a]
                for a in anchors
                if a in mine or a in self.estimates
            }
            default = math.fsum(values.values()) / len(values) if values else 0.0
        return environment_pb2.StateValues(values=values, default_value=default)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "returns": self.returns.to_dict(),
            "estimates": dict(self.estimates),
            "recent": list(self._recent),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ValueTable:
        table = cls(doc["source"])
        table.returns = AnchorMonteCarlo.from_dict(doc.get("returns", {}))
        estimates = doc.get("estimates", doc.get("critic", {}))
        table.estimates = OrderedDict((str(k), float(v)) for k, v in estimates.items())
        for anchor in doc.get("recent", []):
            table._seen(str(anchor))
        return table


class EpisodeValues:
    """What one episode's requests carry during a collection: ``base`` (the table when the
    collection started) plus the estimates this episode observed since (module docstring)."""

    def __init__(self, base: ValueTable) -> None:
        self.base = base
        self.own: OrderedDict[str, float] = OrderedDict()

    def observe(self, anchor: str, value: float | None) -> None:
        """The policy's value of ``anchor`` as this episode just observed it (``policy``)."""
        if self.base.source == "policy" and value is not None and math.isfinite(value):
            self.own[anchor] = value
            self.own.move_to_end(anchor)

    def proto(self) -> environment_pb2.StateValues:
        return self.base.proto(self.own)
