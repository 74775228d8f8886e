"""The run directory: what a user reads after (and during) a training run.

::

    spec.yaml           the resolved RunSpec (every default filled in)
    metrics.jsonl       one JSON object per iteration, namespaced keys (charts/, losses/, time/...)
    trees.jsonl         the search tree of each iteration's best episode (aflowrl.trainer.trees)
    curves.png          episode return, best validation score and the update diagnostics per
                        iteration (aflowrl.trainer.plots; ``aflowrl plot RUN_DIR`` redraws it)
    tensorboard/        TensorBoard event files (monitoring.loggers; aflowrl.trainer.tracking)
    best/               the best workflows found, best first:
      index.json          hash, validation score, iteration and episode of each
      1-<hash>/           workflow.json, graph.py + prompt.py (AFlow), workflow.png (picture)
    best/<benchmark>/   the same per training benchmark, when the run trains on several
    final.json, final.md  the best workflow against the seed and classic baselines (test split),
                        a table per training benchmark (and one for the held-out benchmarks);
                        with held-out benchmarks, the policy on held-out tasks too
    checkpoints.json    the trainer's checkpoint index (aflowrl.trainer.state)
    logs/               service logs (local runs)

``metrics.jsonl`` (and ``trees.jsonl``) hold every iteration exactly once: a resumed run first
drops the records after its checkpoint (:meth:`RunDirectory.truncate_metrics`), then appends.
Files other than these are replaced atomically. Written by :mod:`aflowrl.trainer.loop`.

Keys of a record (NaN is written as null):

- ``iteration`` (0-based), ``time`` (UTC), ``policy_version`` (after the update);
- ``charts/episode_return`` (mean undiscounted return of the iteration's episodes) and
  ``_std``; ``charts/step_reward``; ``charts/iteration_best_score`` (best validation score any
  episode reached), ``charts/best_score`` (the run's best workflow, mean over the episodes that
  evaluated it), ``charts/seed_score``; ``charts/valid_action_ratio``,
  ``charts/duplicate_ratio``; ``charts/episodes``, ``charts/steps``, ``charts/episodes_total``;
- training rows: ``charts/rows_trained``, ``charts/rows_dropped_stale`` (older than
  ``offPolicy.maxStaleness``), ``charts/staleness_mean`` (versions behind the learner),
  ``charts/rows_recomputed`` (old log-probs from the learner), ``charts/is_weight_mean``
  (truncated importance weights), ``charts/advantage_mean`` / ``_std``;
- the learner's ``losses/*``, ``charts/*`` and ``perf/*`` (aflowrl.learner's Train metrics);
- ``rollout/version_min`` / ``_max``: policy versions that made the iteration's decisions;
- ``env/executor_calls`` (fresh executor calls of the steps), ``env/cache_hits`` (problem runs
  the evaluation cache answered), ``env/cost_usd``, ``env/cost_known``, ``env/failovers``
  (calls moved to another replica), ``env/replicas_live``;
- ``noise/resampled_steps``, ``noise/reward_diff_sd``, ``noise/reward_noise_sd``,
  ``noise/reward_sd``, ``noise/signal_to_noise``: the executor-sample noise of the step rewards
  (``environment.evaluation.resampleFraction``; :mod:`aflowrl.trainer.noise`);
- ``weights/seconds``, ``weights/replicas_failed``: the weight push;
- with several training benchmarks, ``charts/episode_return/<benchmark>``,
  ``charts/iteration_best_score/<b>``, ``charts/seed_score/<b>``,
  ``charts/valid_action_ratio/<b>``, ``charts/duplicate_ratio/<b>``, ``charts/episodes/<b>``
  (the benchmarks the iteration's groups drew) and ``charts/best_score/<b>`` (every training
  benchmark with a best workflow); ``charts/best_score`` is then the mean of the benchmarks'
  best scores;
- ``time/<phase>`` for reset, generate, step, advantage, logprob, train, weight_sync,
  checkpoint; ``time/iteration``; ``time/service_calls`` (some call in flight);
  ``time/overhead_ratio`` (the trainer's own share of the iteration).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from aflowrl.config import RunSpec
from aflowrl.trainer.state import BestWorkflow

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
TREES_FILE = "trees.jsonl"
CURVES_FILE = "curves.png"


def utc_now() -> str:
    """The time as RFC 3339 UTC with seconds (``2025-01-31T12:00:00Z``)."""
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _atomic_write(path: Path, data: str | bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    if isinstance(data, bytes):
        tmp.write_bytes(data)
    else:
        tmp.write_text(data, encoding="utf-8")
    os.replace(tmp, path)


def _json_value(value: Any) -> Any:
    """NaN and infinities as null (JSON has none)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _append_line(path: Path, record: Mapping[str, Any]) -> None:
    line = json.dumps({k: _json_value(v) for k, v in record.items()}, sort_keys=False)
    with path.open("a", encoding="utf-8") as out:
        out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, one per line (a torn line, from a crash
    mid-write, is skipped with a warning; a missing file has none)."""
    if not path.is_file():
        return []
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            logger.warning("%s:%d: torn record skipped", path, number)
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            logger.warning("%s:%d: not a JSON object, skipped", path, number)
    return records


def _truncate(path: Path, iterations: int) -> int:
    """Keep the records of ``path`` with ``iteration < iterations``; returns how many went."""
    records = read_records(path)
    kept = [r for r in records if int(r.get("iteration", -1)) < iterations]
    dropped = len(records) - len(kept)
    text = "".join(json.dumps(r) + "\n" for r in kept)
    if dropped or (path.is_file() and path.read_text() != text):
        _atomic_write(path, text)
    return dropped


class RunDirectory:
    """Files of one run (module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.metrics_file = self.path / METRICS_FILE
        self.logs = self.path / "logs"

    # ---- spec ---------------------------------------------------------------------------------

    def write_spec(self, spec: RunSpec) -> Path:
        target = self.path / "spec.yaml"
        _atomic_write(target, yaml.safe_dump(spec.to_document(), sort_keys=False, width=100))
        return target

    # ---- metrics ------------------------------------------------------------------------------

    def append_metrics(self, record: Mapping[str, Any]) -> None:
        """Append one iteration's record (one line, flushed and synced)."""
        _append_line(self.metrics_file, record)

    def read_metrics(self) -> list[dict[str, Any]]:
        """Every complete record (a torn last line, from a crash mid-write, is skipped)."""
        return read_records(self.metrics_file)

    def truncate_metrics(self, iterations: int) -> int:
        """Keep only the records of iterations ``< iterations`` (in ``metrics.jsonl`` and
        ``trees.jsonl``); returns how many metrics records were dropped."""
        _truncate(self.trees_file, iterations)
        return _truncate(self.metrics_file, iterations)

    # ---- search trees ---------------------------------------------------------------------------

    @property
    def trees_file(self) -> Path:
        return self.path / TREES_FILE

    def append_tree(self, tree: Mapping[str, Any]) -> None:
        """Append one iteration's search tree (:mod:`aflowrl.trainer.trees`)."""
        _append_line(self.trees_file, tree)

    def read_trees(self) -> list[dict[str, Any]]:
        """Every complete tree record."""
        return read_records(self.trees_file)

    # ---- curves ------------------------------------------------------------------------------

    def plot_curves(self, records: Sequence[Mapping[str, Any]] | None = None) -> Path | None:
        """Draw ``curves.png`` from the metrics (None when there is nothing to draw)."""
        from aflowrl.trainer import plots

        records = self.read_metrics() if records is None else records
        if not records:
            return None
        target = self.path / CURVES_FILE
        _atomic_write(target, plots.curves_png(records))
        return target

    # ---- best workflows --------------------------------------------------------------------------

    def write_best(
        self, best: Sequence[BestWorkflow], *, benchmark: str, subdir: str = "best"
    ) -> Path:
        """``<subdir>/`` (``best/``, or ``best/<benchmark>/`` for one benchmark of several):
        index.json and, per workflow, its JSON, AFlow code and picture.

        A workflow already written (under any rank) is moved to its new rank, not rendered again.
        """
        from aflowrl.workflow import Graph, export_aflow, save_png

        root = self.path / subdir
        root.mkdir(parents=True, exist_ok=True)
        written = {d.name.partition("-")[2]: d for d in root.iterdir() if d.is_dir()}
        index = []
        keep = set()
        for rank, entry in enumerate(best, 1):
            name = f"{rank}-{entry.hash[:12]}"
            keep.add(name)
            folder = root / name
            earlier = written.get(entry.hash[:12])
            if earlier is not None and earlier != folder:
                earlier.rename(folder)
            folder.mkdir(exist_ok=True)
            if entry.workflow_json is not None and not (folder / "workflow.png").is_file():
                graph = Graph.from_json(entry.workflow_json, source=f"best workflow {entry.hash}")
                if entry.episode != "seed":
                    graph = graph.found_as(
                        f"{benchmark}-{entry.hash[:12]}",
                        f"Found by aflow-rl's workflow search on {benchmark} (iteration "
                        f"{entry.iteration}, episode {entry.episode})",
                    )
                _atomic_write(folder / "workflow.json", graph.to_json() + "\n")
                for file, text in export_aflow(graph, dataset=benchmark).items():
                    _atomic_write(folder / file, text)
                save_png(graph, folder / "workflow.png")  # last: it marks the folder complete
            files = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
            index.append(
                {
                    "rank": rank,
                    "hash": entry.hash,
                    "validation_score": entry.score,
                    "iteration": entry.iteration,
                    "episode": entry.episode,
                    "dir": f"{subdir}/{name}",
                    "files": files,
                }
            )
        for stale in root.iterdir():  # workflows no longer among the best
            if stale.is_dir() and stale.name not in keep:
                shutil.rmtree(stale)
        _atomic_write(root / "index.json", json.dumps(index, indent=2) + "\n")
        return root

    # ---- final table ---------------------------------------------------------------------------

    def write_warm_start(self, summary: Mapping[str, Any]) -> Path:
        """``warmstart/summary.json``: what the supervised warm start did."""
        target = self.path / "warmstart" / "summary.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(target, json.dumps(dict(summary), indent=2) + "\n")
        return target

    def write_final(self, rows: Sequence[Mapping[str, Any]], table: str) -> None:
        _atomic_write(self.path / "final.json", json.dumps(list(rows), indent=2) + "\n")
        _atomic_write(self.path / "final.md", table + "\n")

    def write_start_held_out(self, episodes: Sequence[Mapping[str, Any]]) -> None:
        """``start_held_out.json``: the episodes of the policy RL started from on the held-out
        tasks the run ends with."""
        doc = [{k: _json_value(v) for k, v in e.items()} for e in episodes]
        _atomic_write(self.path / "start_held_out.json", json.dumps(doc, indent=2) + "\n")

    def read_start_held_out(self) -> list[dict[str, Any]] | None:
        """What :meth:`write_start_held_out` wrote, or None."""
        path = self.path / "start_held_out.json"
        if not path.is_file():
            return None
        loaded: list[dict[str, Any]] = json.loads(path.read_text())
        return loaded

    def write_held_out(
        self, episodes: Sequence[Mapping[str, Any]], summaries: Sequence[Mapping[str, Any]]
    ) -> None:
        """``held_out.json``: the policy's episodes on held-out tasks and their summary."""
        doc = {
            "summaries": [{k: _json_value(v) for k, v in s.items()} for s in summaries],
            "episodes": [{k: _json_value(v) for k, v in e.items()} for e in episodes],
        }
        _atomic_write(self.path / "held_out.json", json.dumps(doc, indent=2) + "\n")
