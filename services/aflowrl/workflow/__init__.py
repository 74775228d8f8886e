"""The workflow graph: operators, canonical hash, interpreter, evaluator, AFlow-code export.

A workflow is a typed graph of AFlow's operators with a prompt table (:mod:`.graph`, operator
table in :mod:`.ops`), with a canonical form and content hash (:mod:`.canonical`). It renders as
text for the policy (:mod:`.render`), as AFlow's ``graph.py`` + ``prompt.py``
(:mod:`.aflow_export`) and as a picture (:mod:`.picture`). The interpreter (:mod:`.interpreter`)
runs it on one problem with an executor and a sandbox; the evaluator (:mod:`.evaluator`) scores it
on a benchmark with repeats and a cache (:mod:`.cache`). The seed and classic workflows ship as
JSON in :mod:`.library`.

Typical use::

    from aflowrl.workflow import Evaluator, library
    graph = library.load("cot_sc", "math")
    result = await Evaluator(executor, benchmark).evaluate(graph, problems, repeats=3)
"""

from aflowrl.workflow import library
from aflowrl.workflow.aflow_export import export_aflow
from aflowrl.workflow.cache import CacheKey, EvaluationCache, ScoredRun
from aflowrl.workflow.canonical import canonical_form, content_hash
from aflowrl.workflow.errors import OperatorOutputError, WorkflowValidationError
from aflowrl.workflow.evaluator import (
    EvaluationResult,
    EvaluationSettings,
    Evaluator,
    ProblemResult,
    SampleResult,
    pool_problems,
    select_problems,
    subset,
)
from aflowrl.workflow.graph import Graph, Node
from aflowrl.workflow.interpreter import Interpreter, RunResult
from aflowrl.workflow.ops import OPS, describe_operators
from aflowrl.workflow.picture import render_svg, save_png
from aflowrl.workflow.render import render_text
from aflowrl.workflow.runtime import CodeRunner, RunSettings, TraceEvent

__all__ = [
    "OPS",
    "CacheKey",
    "CodeRunner",
    "EvaluationCache",
    "EvaluationResult",
    "EvaluationSettings",
    "Evaluator",
    "Graph",
    "Interpreter",
    "Node",
    "OperatorOutputError",
    "ProblemResult",
    "RunResult",
    "RunSettings",
    "SampleResult",
    "ScoredRun",
    "TraceEvent",
    "WorkflowValidationError",
    "canonical_form",
    "content_hash",
    "describe_operators",
    "export_aflow",
    "library",
    "pool_problems",
    "render_svg",
    "render_text",
    "save_png",
    "select_problems",
    "subset",
]
