"""The trainer's own state, saved with every learner checkpoint, and the checkpoint index.

A checkpoint is a learner checkpoint (weights, optimiser, learner RNG, step) whose opaque
``client_state`` holds this :class:`TrainerState` as JSON: iterations completed, the policy
version, the best workflows found, the best and seed scores, the position in ``metrics.jsonl``
and a fingerprint of the spec fields a resumed run must share. The trainer's randomness (task
seeds, choice sampling) is derived from ``(trainer.seed, iteration)``, so the iteration *is* the
trainer's RNG state: a resumed run draws exactly what an uninterrupted one would.

Learner and trainer may not share a filesystem (an emptyDir on Kubernetes), so the trainer keeps
its own index of the checkpoints it asked for (``checkpoints.json`` in its run directory,
replaced atomically after each save); on restart it loads the newest one the learner accepts.
Used by :mod:`aflowrl.trainer.loop`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aflowrl.config import RunSpec
from aflowrl.trainer.errors import ResumeError

logger = logging.getLogger(__name__)

STATE_FORMAT = 1
"""Version of the JSON form; another version is refused."""

INDEX_FILE = "checkpoints.json"


def spec_fingerprint(spec: RunSpec) -> dict[str, Any]:
    """The spec fields a resumed run must share with the run it resumes."""
    return {
        "policy.model": spec.policy.model,
        "environment.benchmark": spec.environment.benchmark,
        "environment.search.actionMode": spec.environment.search.action_mode,
        "learner.algorithm.type": spec.learner.algorithm.type,
        "trainer.seed": spec.trainer.seed,
        "trainer.groupSize": spec.trainer.group_size,
        "trainer.tasksPerIteration": spec.trainer.tasks_per_iteration,
    }


@dataclass
class BestWorkflow:
    """A workflow found by the search, with its validation score."""

    hash: str
    score: float
    iteration: int
    episode: str
    workflow_json: str | None = None
    """The graph as JSON (None when the environment did not send it)."""
    evaluations: int = 1
    """Episodes that evaluated it; ``score`` is the mean of their validation scores (each
    episode scores on its own problem subset)."""


@dataclass
class TrainerState:
    """What a resumed trainer needs (module docstring)."""

    seed: int
    fingerprint: dict[str, Any]
    iteration: int = 0
    """Iterations completed (the next one to run)."""
    policy_version: int = 0
    best: list[BestWorkflow] = field(default_factory=list)
    """The best distinct workflows so far, best first."""
    episodes: int = 0
    metrics_lines: int = 0
    """Records in metrics.jsonl (one per completed iteration)."""
    elapsed_s: float = 0.0
    values: dict[str, Any] | None = None
    """The V(s) table of ``fused`` selection (:class:`aflowrl.trainer.values.ValueTable`)."""
    last_record: dict[str, Any] | None = None
    """The metrics record of the last iteration before the checkpoint (written on resume if the
    trainer stopped between saving the checkpoint and writing the record)."""
    format: int = STATE_FORMAT

    @property
    def best_score(self) -> float | None:
        return self.best[0].score if self.best else None

    def offer(self, candidate: BestWorkflow, keep: int) -> None:
        """Count ``candidate``'s evaluation and keep the ``keep`` best distinct workflows."""
        known = next((b for b in self.best if b.hash == candidate.hash), None)
        if known is None:
            self.best.append(candidate)
        else:
            total = known.score * known.evaluations + candidate.score
            known.evaluations += 1
            known.score = total / known.evaluations
            if known.workflow_json is None:
                known.workflow_json = candidate.workflow_json
        self.best.sort(key=lambda b: (-b.score, b.iteration))
        del self.best[keep:]

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str) -> TrainerState:
        try:
            doc = json.loads(data.decode())
            if doc.get("format") != STATE_FORMAT:
                raise ResumeError(
                    f"trainer state format {doc.get('format')!r} is not {STATE_FORMAT}",
                    field=source,
                )
            doc["best"] = [BestWorkflow(**b) for b in doc.get("best", [])]
            return cls(**doc)
        except (ValueError, TypeError, AttributeError) as exc:
            raise ResumeError(f"unreadable trainer state ({exc})", field=source) from None

    def check_resumable(self, spec: RunSpec) -> None:
        """Raise :class:`ResumeError` naming each field the new spec changed."""
        now = spec_fingerprint(spec)
        changed = [
            f"spec.{name}: the run was {was!r}, the spec says {now.get(name)!r}"
            for name, was in self.fingerprint.items()
            if now.get(name) != was
        ]
        if changed:
            raise ResumeError(
                "cannot resume with another spec (start a new run directory):\n"
                + "\n".join(changed),
                field="run directory",
            )


@dataclass(frozen=True)
class CheckpointEntry:
    iteration: int
    path: str
    policy_version: int


class CheckpointIndex:
    """``checkpoints.json``: the checkpoints this run saved, oldest first (module docstring)."""

    def __init__(self, run_dir: Path) -> None:
        self.file = run_dir / INDEX_FILE

    def entries(self) -> list[CheckpointEntry]:
        if not self.file.is_file():
            return []
        try:
            doc = json.loads(self.file.read_text())
            return [CheckpointEntry(**entry) for entry in doc["checkpoints"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise ResumeError(f"unreadable ({exc})", field=str(self.file)) from None

    def _write(self, entries: list[CheckpointEntry]) -> None:
        tmp = self.file.with_name(f".{self.file.name}.tmp")
        doc = {"checkpoints": [asdict(e) for e in entries]}
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, self.file)

    def add(self, entry: CheckpointEntry, keep: int) -> list[CheckpointEntry]:
        """Record ``entry``; drop (and delete, where visible) all but the ``keep`` newest.

        Returns the entries dropped.
        """
        entries = [e for e in self.entries() if e.iteration != entry.iteration] + [entry]
        entries.sort(key=lambda e: e.iteration)
        dropped, kept = entries[:-keep], entries[-keep:]
        self._write(kept)
        for old in dropped:
            path = Path(old.path)
            if path.is_dir():  # the learner's volume is visible here (local runs, shared PVCs)
                shutil.rmtree(path, ignore_errors=True)
                logger.info("deleted old checkpoint %s", path)
        return dropped

    def discard_after(self, iteration: int) -> None:
        """Forget checkpoints newer than ``iteration`` (they belong to an abandoned future)."""
        entries = self.entries()
        kept = [e for e in entries if e.iteration <= iteration]
        if len(kept) != len(entries):
            self._write(kept)
