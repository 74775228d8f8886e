"""The surrogate executor: a calibrated, offline stand-in for the executor LLM.

It answers benchmark prompts the way gpt-4o-mini does on average, without weights: it finds the
problem a prompt is about (:mod:`.index`), reads what the prompt asks for (:mod:`.reading`),
decides right or wrong with per-problem difficulty and the prompt's features (:mod:`.model`,
numbers in :mod:`.calibration`) and writes a plausible reply (:mod:`.writing`; wrong code is
verified to fail in the sandbox, :mod:`.codelab`). Deterministic given prompt, seed and
temperature.

Use it in-process (:class:`SurrogateExecutor`, an :class:`aflowrl.executor.base.Executor`) or over
the OpenAI HTTP API (:class:`SurrogateServer`, ``aflowrl surrogate serve``). The calibration is
fitted and checked by ``aflowrl surrogate calibrate`` (:mod:`aflowrl.cli.surrogate_calibration`,
which runs workflows, so it sits above both the executor and the workflow layers).
"""

from aflowrl.executor.surrogate.calibration import (
    CALIBRATION_VERSION,
    BenchmarkParams,
    Calibration,
    load_calibration,
)
from aflowrl.executor.surrogate.executor import (
    MODEL_NAME,
    SURROGATE_PRICE,
    Completion,
    SurrogateExecutor,
    SurrogateStats,
    load_problems,
)
from aflowrl.executor.surrogate.index import IndexMatch, ProblemIndex
from aflowrl.executor.surrogate.model import MODEL_VERSION, SurrogateModel
from aflowrl.executor.surrogate.reading import Reading, read_request

__all__ = [
    "CALIBRATION_VERSION",
    "MODEL_NAME",
    "MODEL_VERSION",
    "SURROGATE_PRICE",
    "BenchmarkParams",
    "Calibration",
    "Completion",
    "IndexMatch",
    "ProblemIndex",
    "Reading",
    "SurrogateExecutor",
    "SurrogateModel",
    "SurrogateStats",
    "load_calibration",
    "load_problems",
    "read_request",
]
