"""The workflow library: AFlow's seed and the classic baselines, per task type, as JSON.

Files are ``<task_type>_<name>.json`` next to this module (package data):

* ``seed``: AFlow's starting point, one Custom call;
* ``io``: the problem sent as is;
* ``cot``: one step-by-step call (AnswerGenerate for QA, so only the short answer is scored);
* ``cot_sc``: five CoT samples and ScEnsemble (self-consistency);
* ``medprompt``: three CoT answers and MdEnsemble with five shuffled votes;
* ``self_refine``: a CoT answer and up to three review/revise rounds.

Used by ``aflowrl eval``, the search (seed workflows, baselines) and the surrogate's calibration.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Final, get_args

from aflowrl import documents
from aflowrl.benchmarks.base import TaskType
from aflowrl.errors import InvalidInputError, NotFoundError
from aflowrl.workflow.errors import WorkflowValidationError
from aflowrl.workflow.graph import MAX_JSON_CHARS, Graph

__all__ = ["CLASSIC", "NAMES", "load", "resolve"]

NAMES: Final = ("seed", "io", "cot", "cot_sc", "medprompt", "self_refine")
"""Every library workflow name (each exists for every task type)."""

CLASSIC: Final = ("io", "cot", "cot_sc", "medprompt", "self_refine")
"""The classic baselines of the AFlow paper's Table 1."""


def load(name: str, task_type: TaskType) -> Graph:
    """The library workflow ``name`` for ``task_type`` (e.g. ``load("cot_sc", "math")``)."""
    if task_type not in get_args(TaskType):
        raise InvalidInputError(f"unknown task type {task_type!r}", field="task_type")
    if name not in NAMES:
        raise NotFoundError(f"no library workflow {name!r} (one of {', '.join(NAMES)})")
    file = resources.files(__name__).joinpath(f"{task_type}_{name}.json")
    return Graph.from_json(file.read_text(encoding="utf-8"), source=f"library {name}")


def resolve(spec: str, task_type: TaskType) -> Graph:
    """A library name, or the path of a workflow JSON file (checked against ``task_type``)."""
    if spec in NAMES:
        return load(spec, task_type)
    path = Path(spec)
    if not path.is_file():
        raise NotFoundError(
            f"{spec!r} is neither a library workflow ({', '.join(NAMES)}) nor a JSON file"
        )
    text = documents.read_text(path, source=str(path), max_bytes=MAX_JSON_CHARS)
    try:
        graph = Graph.from_json(text, source=str(path))
    except WorkflowValidationError as exc:
        raise exc.within(str(path)) from None
    if graph.task_type != task_type:
        raise InvalidInputError(
            f"{path} is a {graph.task_type} workflow; this benchmark needs {task_type}",
            field="task_type",
        )
    return graph
