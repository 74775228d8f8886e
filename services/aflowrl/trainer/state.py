"""The trainer's own state, saved with every learner checkpoint, and the checkpoint index.

A checkpoint is a learner checkpoint (weights, optimiser, learner RNG, step) whose opaque
``client_state`` holds this :class:`TrainerState` as JSON: iterations completed, the policy
version, the best workflows found on each training benchmark, the position in
``metrics.jsonl`` and a fingerprint of the spec fields a resumed run must share. A state of
format 1 (one benchmark, saved before runs could mix benchmarks) is read as format 2. The
trainer's randomness (tasks, choice sampling) is derived from ``(trainer.seed, iteration)``, so
the iteration *is* the trainer's RNG state: a resumed run draws exactly what an uninterrupted
one would.

Learner and trainer may not share a filesystem (an emptyDir on Kubernetes), so the trainer keeps
its own index of the checkpoints it asked for (``checkpoints.json`` in its run directory,
replaced atomically after each save); on restart it loads the newest one the learner accepts.
Used by :mod:`aflowrl.trainer.loop`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aflowrl.config import RunSpec
from aflowrl.trainer.errors import ResumeError

logger = logging.getLogger(__name__)

STATE_FORMAT = 2
"""Version of the JSON form; format 1 is migrated, others are refused."""

INDEX_FILE = "checkpoints.json"


def spec_fingerprint(spec: RunSpec) -> dict[str, Any]:
    """The spec fields a resumed run must share with the run it resumes."""
    return {
        "policy.model": spec.policy.model,
        "environment.benchmarks": list(spec.environment.training_benchmarks),
        "environment.heldOutBenchmarks": list(spec.environment.held_out_benchmarks),
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
    best: dict[str, list[BestWorkflow]] = field(default_factory=dict)
    """The best distinct workflows so far on each training benchmark, best first."""
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
        """The best workflow's score; with several benchmarks, the mean of each one's best."""
        tops = [kept[0].score for kept in self.best.values() if kept]
        return math.fsum(tops) / len(tops) if tops else None

    def offer(self, benchmark: str, candidate: BestWorkflow, keep: int) -> None:
        """Count ``candidate``'s evaluation on ``benchmark`` and keep that benchmark's ``keep``
        best distinct workflows."""
        best = self.best.setdefault(benchmark, [])
        known = next((b for b in best if b.hash == candidate.hash), None)
        if known is None:
            best.append(candidate)
        else:
            total = known.score * known.evaluations + candidate.score
            known.evaluations += 1
            known.score = total / known.evaluations
            if known.workflow_json is None:
                known.workflow_json = candidate.workflow_json
        best.sort(key=lambda b: (-b.score, b.iteration))
        del best[keep:]

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str) -> TrainerState:
        try:
            doc = json.loads(data.decode())
            if doc.get("format") == 1:
                doc = _from_format_1(doc)
            if doc.get("format") != STATE_FORMAT:
                raise ResumeError(
                    f"trainer state format {doc.get('format')!r} is not {STATE_FORMAT}",
                    field=source,
                )
            doc["best"] = {
                name: [BestWorkflow(**b) for b in kept]
                for name, kept in doc.get("best", {}).items()
            }
            return cls(**doc)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
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


def _from_format_1(doc: dict[str, Any]) -> dict[str, Any]:
    """A format-1 state (one benchmark, ``environment.benchmark``) in format 2."""
    fingerprint = dict(doc["fingerprint"])
    benchmark = fingerprint.pop("environment.benchmark")
    fingerprint["environment.benchmarks"] = [benchmark]
    fingerprint["environment.heldOutBenchmarks"] = []
    return {
        **doc,
        "fingerprint": fingerprint,
        "best": {benchmark: doc.get("best", [])},
        "format": 2,
    }


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
