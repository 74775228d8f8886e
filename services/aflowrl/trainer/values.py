"""V(s) for ``fused`` parent selection, which the trainer sends with every Reset and Step.

With ``environment.search.selection: fused`` the environment picks the next workflow to modify
by (1-w) UCB + w V(s) and keeps no value table of its own: the caller sends one
(``StateValues``: workflow hash -> V). The trainer keeps it from what it learns:

- ``anchor-mc``: the mean return observed from each anchor state, the undiscounted sum of the
  rewards an episode collected from that step on (return units, as the search's value sources
  use), over every episode so far (:class:`aflowrl.search.AnchorMonteCarlo`); unseen states get
  the prior 0;
- ``critic``: the learner's value head at the last observation of each anchor (the PPO critic's
  V(s_t), computed for the advantages anyway); unseen states get the mean of the known ones.

At most :data:`MAX_SENT` anchors are sent, those seen most recently. The table is part of the
trainer's checkpointed state. Used by :mod:`aflowrl.trainer.collect` and the loop.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from aflowrl._proto.v1 import environment_pb2
from aflowrl.search import AnchorMonteCarlo
from aflowrl.trainer.rows import StepRow

MAX_SENT = 50_000
"""Anchors sent per request (the environment accepts 100,000)."""

ValueSourceName = Literal["anchor-mc", "critic"]


class ValueTable:
    """The values the trainer sends (module docstring)."""

    def __init__(self, source: ValueSourceName) -> None:
        self.source = source
        self.returns = AnchorMonteCarlo(prior=0.0)
        self.critic: OrderedDict[str, float] = OrderedDict()
        self._recent: OrderedDict[str, None] = OrderedDict()

    def _seen(self, anchor: str) -> None:
        self._recent[anchor] = None
        self._recent.move_to_end(anchor)
        while len(self._recent) > MAX_SENT:
            self._recent.popitem(last=False)

    def record(self, rows: Sequence[StepRow], critic_values: Sequence[float] | None = None) -> None:
        """Add an iteration's rows: return-to-go per anchor, or the critic's V(s_t)."""
        if self.source == "critic":
            for row, value in zip(rows, critic_values or (), strict=False):
                if math.isfinite(value):
                    self.critic[row.anchor] = value
                    self.critic.move_to_end(row.anchor)
                    self._seen(row.anchor)
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

    def proto(self) -> environment_pb2.StateValues:
        """The request field: the most recent anchors and the default for the rest."""
        anchors = list(self._recent)
        if self.source == "critic":
            known = [self.critic[a] for a in anchors if a in self.critic]
            default = math.fsum(known) / len(known) if known else 0.0
            values = {a: self.critic[a] for a in anchors if a in self.critic}
        else:
            default = self.returns.prior
            values = {a: self.returns.value(a) for a in anchors}
        return environment_pb2.StateValues(values=values, default_value=default)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "returns": self.returns.to_dict(),
            "critic": dict(self.critic),
            "recent": list(self._recent),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ValueTable:
        table = cls(doc["source"])
        table.returns = AnchorMonteCarlo.from_dict(doc.get("returns", {}))
        table.critic = OrderedDict((str(k), float(v)) for k, v in doc.get("critic", {}).items())
        for anchor in doc.get("recent", []):
            table._seen(str(anchor))
        return table
