"""The run directory of ``aflowrl optimize``: everything a run wrote, and how it resumes.

Layout::

    run.json              what the run is (benchmark, seed, proposer, executor, settings)
    state.json            the episode state after the last finished round (the whole tree)
    rounds.jsonl          one line per round: parent, action, validity, score, reward, cost
    rounds/round_<k>.json the workflow round k made (new workflows only)
    tree.json             the tree, readable: every workflow with its score, parent and action
    best/                 the best workflow: workflow.json, graph.py + prompt.py (AFlow), .svg/.png
    final.json, final.txt the best workflow, the seed and the classic baselines on the test split
    cache.sqlite          the evaluation cache (a resumed run re-evaluates nothing)

A round is committed by writing its line to ``rounds.jsonl`` and then replacing ``state.json``
atomically; on resume, lines past the state's step (a round interrupted between the two writes)
are dropped, so every round is recorded exactly once.

Used by :mod:`aflowrl.search.optimize`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from aflowrl.errors import InvalidInputError
from aflowrl.search.state import EpisodeState, graph_at
from aflowrl.workflow import Graph, export_aflow, render_svg
from aflowrl.workflow.aflow_export import AFLOW_DATASETS

logger = logging.getLogger(__name__)

MANIFEST_VERSION: Final = 1


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _dump(doc: Any) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


class RunDirectory:
    """Files of one ``aflowrl optimize`` run."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise InvalidInputError(f"{self.path} is not a directory", field="--run-dir")
        self.path.mkdir(parents=True, exist_ok=True)

    @property
    def cache_path(self) -> Path:
        return self.path / "cache.sqlite"

    # ------------------------------------------------------------------ manifest
    def check_manifest(self, manifest: Mapping[str, Any], *, ignore: frozenset[str]) -> bool:
        """Write ``run.json``, or check it against an existing one; True when resuming.

        Keys in ``ignore`` (e.g. the round count) may differ between runs.
        """
        file = self.path / "run.json"
        doc = {"version": MANIFEST_VERSION, **manifest}
        if not file.exists():
            _write_atomic(file, _dump(doc))
            return False
        try:
            old = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise InvalidInputError(f"{file} is unreadable: {exc}", field="--run-dir") from None
        for key, value in doc.items():
            if key not in ignore and old.get(key) != value:
                raise InvalidInputError(
                    f"{file} was written for {key}={old.get(key)!r}, not {value!r}: resume with "
                    "the same settings or choose another --run-dir",
                    field=key,
                )
        _write_atomic(file, _dump({**old, **{k: doc[k] for k in ignore if k in doc}}))
        return True

    # ------------------------------------------------------------------ state and rounds
    def load_state(self) -> EpisodeState | None:
        file = self.path / "state.json"
        if not file.exists():
            return None
        state = EpisodeState.from_json(file.read_bytes())
        self._truncate_rounds(state.step)
        return state

    def _truncate_rounds(self, step: int) -> None:
        file = self.path / "rounds.jsonl"
        if not file.exists():
            return
        kept = []
        for line in file.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by the interruption
            if int(record.get("round", -1)) <= step:
                kept.append(line)
        _write_atomic(file, "".join(f"{line}\n" for line in kept))

    def commit_round(
        self, record: Mapping[str, Any], state: EpisodeState, workflow: Graph | None
    ) -> None:
        """Record one finished round (its line, its new workflow, then the state)."""
        if workflow is not None:
            rounds = self.path / "rounds"
            rounds.mkdir(exist_ok=True)
            _write_atomic(rounds / f"round_{record['round']}.json", workflow.to_json() + "\n")
        with (self.path / "rounds.jsonl").open("a", encoding="utf-8") as out:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
        _write_atomic(self.path / "state.json", state.to_json())

    def rounds(self) -> list[dict[str, Any]]:
        file = self.path / "rounds.jsonl"
        if not file.exists():
            return []
        return [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines()]

    # ------------------------------------------------------------------ results
    def write_tree(self, state: EpisodeState) -> None:
        nodes = []
        for i, node in enumerate(state.nodes):
            nodes.append(
                {
                    "index": i,
                    "parent": node.parent,
                    "round": node.step,
                    "action": node.action,
                    "hash": node.hash,
                    "score": node.score,
                    "std": node.std,
                    "cost_usd": node.cost_usd,
                    "executor_calls": node.calls,
                    "visits": state.visits(i),
                    "workflow": graph_at(state, i).to_dict(),
                }
            )
        doc = {
            "benchmark": state.benchmark,
            "seed": state.seed,
            "rounds": state.step,
            "best": state.best,
            "best_score": state.best_score,
            "seed_score": state.nodes[0].score,
            "done_reason": state.done_reason,
            "nodes": nodes,
        }
        _write_atomic(self.path / "tree.json", _dump(doc))

    def write_best(self, state: EpisodeState) -> Path:
        """The best workflow as JSON, AFlow code and a picture; returns the folder."""
        best = self.path / "best"
        best.mkdir(exist_ok=True)
        graph = graph_at(state, state.best)
        edits: list[str] = []
        index: int | None = state.best
        while index is not None and (action := state.nodes[index].action) is not None:
            edits.append(action)
            index = state.nodes[index].parent
        if edits:
            graph = graph.found_as(
                f"{state.benchmark}-{state.nodes[state.best].hash[:12]}",
                f"Found by aflow-rl's workflow search on {state.benchmark} with "
                f"{len(edits)} edit{'s' if len(edits) > 1 else ''} ({'; '.join(reversed(edits))})",
            )
        _write_atomic(best / "workflow.json", graph.to_json() + "\n")
        dataset = AFLOW_DATASETS.get(state.benchmark)
        for name, text in export_aflow(
            graph, dataset=dataset, round=state.nodes[state.best].step + 1
        ).items():
            _write_atomic(best / name, text)
        _write_atomic(best / "workflow.svg", render_svg(graph))
        try:
            from aflowrl.workflow import save_png

            save_png(graph, best / "workflow.png")
        except ImportError as exc:  # matplotlib is in the "env" extra
            logger.warning("no PNG of the best workflow (%s); the SVG is there", exc)
        return best

    def write_final(self, doc: Mapping[str, Any], table: str) -> None:
        _write_atomic(self.path / "final.json", _dump(doc))
        _write_atomic(self.path / "final.txt", table + "\n")
