"""The evaluation cache: scored runs of whole workflows, and the draws of single nodes.

Two tables, both keyed by the problem, the sample index (which fixes the run's seeds) and the
executor with its settings:

* ``runs``: one scored run per workflow hash. A run is deterministic given the workflow's
  canonical hash and that key, so trajectories that reach the same workflow share its
  evaluation, and repeating an evaluation costs nothing.
* ``draws``: one result per node draw, keyed by the node's own content, its canonical position
  and the values of its inputs in the run (:meth:`aflowrl.workflow.canonical.UpstreamHash.key`)
  and the draw's index (a fan-out sample, a MedPrompt vote). A child workflow reuses the
  parent's draws for every node its edit did not touch (and for those after it whose inputs came
  out the same), so an edit pays only for the nodes it changes.

Entries live in memory (bounded, least recently used first out) and, when a path is given, in
SQLite, which survives restarts. Draws that made no executor call and ran no code (an ensemble
of one, a revision skipped after a passing review) are not stored: recomputing them is free.

Used by :class:`aflowrl.workflow.evaluator.Evaluator` (one cache per process, shared by the
evaluations of every episode it serves; the SQLite file is written by that process only).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections import OrderedDict
from dataclasses import dataclass, fields
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from aflowrl.errors import InvalidInputError

logger = logging.getLogger(__name__)

SCHEMA_VERSION: Final = 2
"""2: node draws; seeds derive from upstream hashes (runs stored by version 1 are dropped)."""


@dataclass(frozen=True)
class CacheKey:
    """What identifies one scored run."""

    workflow_hash: str
    """:attr:`aflowrl.workflow.graph.Graph.content_hash`."""
    problem: str
    """``<benchmark>/<problem_id>``."""
    sample: int
    """Repeat index (it fixes the run's seeds)."""
    executor: str
    """Executor id plus what else changes answers (run settings, base seed)."""


@dataclass(frozen=True)
class ScoredRun:
    """A scored run as stored (no trace: traces are large and only needed when fresh)."""

    score: float
    answer: str
    extracted: str
    """What the scorer took as the answer."""
    detail: str
    """Why it scored so (scorer's reason, or the run's error)."""
    error: str | None
    """Why the run produced no answer (unparseable output, timeout), or None."""
    cost_usd: float | None
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    llm_calls: int
    sandbox_runs: int

    def stored_fields(self) -> dict[str, Any]:
        """The fields of :class:`ScoredRun` only (a subclass's extras left out)."""
        return {f.name: getattr(self, f.name) for f in fields(ScoredRun)}

    def to_json(self) -> str:
        return json.dumps(self.stored_fields(), ensure_ascii=False, separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> ScoredRun:
        doc: dict[str, Any] = json.loads(text)
        names = {f.name for f in fields(ScoredRun)}
        return ScoredRun(**{k: v for k, v in doc.items() if k in names})


@dataclass(frozen=True)
class DrawKey:
    """What identifies one draw of one node in one run."""

    draw: str
    """``<draw key>`` (a whole node) or ``<draw key>/<index>``
    (:meth:`aflowrl.workflow.canonical.UpstreamHash.key`)."""
    problem: str
    """``<benchmark>/<problem_id>`` (plus a digest of the public tests when overridden)."""
    sample: int
    """Repeat index of the run (it fixes the run's seeds)."""
    executor: str
    """Executor id plus what else changes answers (run settings, base seed)."""


@dataclass(frozen=True)
class StoredDraw:
    """A node draw as stored: its value (tagged JSON) and what making it cost."""

    value: dict[str, Any]
    """The draw's outcome, encoded by :mod:`aflowrl.workflow.runtime`."""
    llm_calls: int
    sandbox_runs: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None

    @property
    def worth_storing(self) -> bool:
        """Whether reusing it saves anything (an executor call or a sandbox run)."""
        return self.llm_calls > 0 or self.sandbox_runs > 0

    def to_json(self) -> str:
        doc = {f.name: getattr(self, f.name) for f in fields(StoredDraw)}
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> StoredDraw:
        doc: dict[str, Any] = json.loads(text)
        return StoredDraw(**{f.name: doc[f.name] for f in fields(StoredDraw)})


class EvaluationCache:
    """Memory LRU in front of an optional SQLite file. ``with EvaluationCache(path) as c:``."""

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        max_memory_entries: int = 200_000,
        max_memory_draws: int = 200_000,
    ):
        self.path = Path(path) if path is not None else None
        self.max_memory_entries = max_memory_entries
        self.max_memory_draws = max_memory_draws
        self._memory: OrderedDict[CacheKey, ScoredRun] = OrderedDict()
        self._draws: OrderedDict[DrawKey, StoredDraw] = OrderedDict()
        self._db: sqlite3.Connection | None = None
        self.hits = 0
        self.misses = 0
        self.draw_hits = 0
        self.draw_misses = 0
        if self.path is not None:
            self._db = _open(self.path)

    def __len__(self) -> int:
        """Scored runs held (node draws are counted by :attr:`draw_count`)."""
        if self._db is not None:
            (count,) = self._db.execute("SELECT COUNT(*) FROM runs").fetchone()
            return int(count)
        return len(self._memory)

    @property
    def draw_count(self) -> int:
        """Node draws held."""
        if self._db is not None:
            (count,) = self._db.execute("SELECT COUNT(*) FROM draws").fetchone()
            return int(count)
        return len(self._draws)

    def get(self, key: CacheKey) -> ScoredRun | None:
        run = self._memory.get(key)
        if run is not None:
            self._memory.move_to_end(key)
        elif self._db is not None:
            row = self._db.execute(
                "SELECT result FROM runs WHERE workflow_hash=? AND problem=? AND sample=? "
                "AND executor=?",
                (key.workflow_hash, key.problem, key.sample, key.executor),
            ).fetchone()
            if row is not None:
                run = ScoredRun.from_json(row[0])
                self._remember(key, run)
        if run is None:
            self.misses += 1
        else:
            self.hits += 1
        return run

    def put(self, key: CacheKey, run: ScoredRun) -> None:
        self._remember(key, run)
        if self._db is not None:
            with self._db:
                self._db.execute(
                    "INSERT OR REPLACE INTO runs (workflow_hash, problem, sample, executor, "
                    "result, created) VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        key.workflow_hash,
                        key.problem,
                        key.sample,
                        key.executor,
                        run.to_json(),
                        time.time(),
                    ),
                )

    def _remember(self, key: CacheKey, run: ScoredRun) -> None:
        _remember(self._memory, key, run, self.max_memory_entries)

    def get_draw(self, key: DrawKey) -> StoredDraw | None:
        draw = self._draws.get(key)
        if draw is not None:
            self._draws.move_to_end(key)
        elif self._db is not None:
            row = self._db.execute(
                "SELECT result FROM draws WHERE draw=? AND problem=? AND sample=? AND executor=?",
                (key.draw, key.problem, key.sample, key.executor),
            ).fetchone()
            if row is not None:
                draw = StoredDraw.from_json(row[0])
                _remember(self._draws, key, draw, self.max_memory_draws)
        if draw is None:
            self.draw_misses += 1
        else:
            self.draw_hits += 1
        return draw

    def put_draw(self, key: DrawKey, draw: StoredDraw) -> None:
        """Store a draw (one that saves nothing when reused is skipped)."""
        if not draw.worth_storing:
            return
        _remember(self._draws, key, draw, self.max_memory_draws)
        if self._db is not None:
            with self._db:
                self._db.execute(
                    "INSERT OR REPLACE INTO draws (draw, problem, sample, executor, result, "
                    "created) VALUES (?, ?, ?, ?, ?, ?)",
                    (key.draw, key.problem, key.sample, key.executor, draw.to_json(), time.time()),
                )

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> EvaluationCache:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _remember(memory: OrderedDict[Any, Any], key: object, value: object, bound: int) -> None:
    memory[key] = value
    memory.move_to_end(key)
    while len(memory) > bound:
        memory.popitem(last=False)


def _open(path: Path) -> sqlite3.Connection:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return _prepare(sqlite3.connect(path), path)
    except (OSError, sqlite3.Error) as exc:
        raise InvalidInputError(f"cannot use {path}: {exc}", field="cache_path") from exc


def _prepare(db: sqlite3.Connection, path: Path) -> sqlite3.Connection:
    # WAL with synchronous=NORMAL: a commit per run without an fsync per commit; a crash can lose
    # the last runs but never corrupt the file.
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    with db:
        db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute(
            "CREATE TABLE IF NOT EXISTS runs (workflow_hash TEXT NOT NULL, problem TEXT NOT NULL, "
            "sample INTEGER NOT NULL, executor TEXT NOT NULL, result TEXT NOT NULL, "
            "created REAL NOT NULL, PRIMARY KEY (workflow_hash, problem, sample, executor)) "
            "WITHOUT ROWID"
        )
        db.execute(
            "CREATE TABLE IF NOT EXISTS draws (draw TEXT NOT NULL, problem TEXT NOT NULL, "
            "sample INTEGER NOT NULL, executor TEXT NOT NULL, result TEXT NOT NULL, "
            "created REAL NOT NULL, PRIMARY KEY (draw, problem, sample, executor)) WITHOUT ROWID"
        )
        row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if row is None:
            db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        elif row[0] != str(SCHEMA_VERSION):
            logger.warning(
                "evaluation cache %s has schema %s (this reads %d): starting it afresh",
                path,
                row[0],
                SCHEMA_VERSION,
            )
            db.execute("DELETE FROM runs")
            db.execute("DELETE FROM draws")
            db.execute("UPDATE meta SET value=? WHERE key='schema'", (str(SCHEMA_VERSION),))
    logger.info("evaluation cache %s", path)
    return db
