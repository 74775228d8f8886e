"""The operator table: what each node kind takes, which parameters it has, what it produces.

A workflow node names one entry of :data:`OPS` in its ``op`` field. Each :class:`OpSpec` lists
the node's input slots (which kinds of value each accepts), its typed parameters (a pydantic
model with bounds), the task types it makes sense for, and how many LLM calls it can make. The
graph validator (:mod:`aflowrl.workflow.graph`), the interpreter, the renderers and the search's
observation (operator descriptions) all read this one table.

Values flowing along edges have a kind:

* ``solution``: one text (an answer, a piece of reasoning, Python code);
* ``candidates``: several solutions (a fan-out node with ``samples`` > 1);
* ``verdict``: a review's judgement (passed or not, and feedback).

The pseudo-node ``problem`` is the problem statement; only the inputs of generating operators
may read it (every operator sees the problem anyway, as AFlow's operators do).

The operators are AFlow's set (Custom, AnswerGenerate, CustomCodeGenerate, ScEnsemble,
MdEnsemble, Programmer, Test, Review, Revise, Format) plus one control node, ``ReviseLoop``, the
bounded review/revise loop. The other control structures are a fan-out (``samples`` on a
generating node), the bounded test/fix loop (``Test``, as in AFlow) and final extraction
(``Format``, and code extraction at the output of code workflows).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from aflowrl.benchmarks.base import TaskType

OpName = Literal[
    "Custom",
    "AnswerGenerate",
    "CustomCodeGenerate",
    "ScEnsemble",
    "MdEnsemble",
    "Programmer",
    "Test",
    "Review",
    "Revise",
    "Format",
    "ReviseLoop",
]

ValueKind = Literal["solution", "candidates", "verdict"]

PROBLEM: Final = "problem"
"""The reference to the problem statement in node inputs."""

NAME_PATTERN: Final = r"^[a-z][a-z0-9_]{0,39}$"
"""Node ids and prompt names: lower-case identifiers (they become Python names on export)."""

MAX_SAMPLES: Final = 16
MAX_VOTES: Final = 15
MAX_ROUNDS: Final = 5
MAX_ATTEMPTS: Final = 5
MAX_CANDIDATES: Final = 26
"""Candidates shown to an ensemble are labelled A..Z."""

ALL_TASKS: Final[frozenset[TaskType]] = frozenset({"math", "code", "qa"})

PromptRef = str | None


class OpParams(BaseModel):
    """Parameters of a node; each operator has its own subclass (unknown fields are errors)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class CustomParams(OpParams):
    instruction: PromptRef = Field(default=None, pattern=NAME_PATTERN)
    """Name of the prompt-table entry put before the input; none sends the input alone."""
    samples: int = Field(default=1, ge=1, le=MAX_SAMPLES)
    """Independent samples drawn concurrently (fan-out); more than one gives candidates."""


class AnswerGenerateParams(OpParams):
    samples: int = Field(default=1, ge=1, le=MAX_SAMPLES)
    """Independent samples drawn concurrently (fan-out)."""


class CustomCodeGenerateParams(OpParams):
    instruction: PromptRef = Field(default=None, pattern=NAME_PATTERN)
    """Name of the prompt-table entry put before the problem."""
    samples: int = Field(default=1, ge=1, le=MAX_SAMPLES)
    """Independent samples drawn concurrently (fan-out)."""


class ProgrammerParams(OpParams):
    samples: int = Field(default=1, ge=1, le=MAX_SAMPLES)
    """Independent programs written and run concurrently (fan-out)."""
    max_attempts: int = Field(default=3, ge=1, le=MAX_ATTEMPTS)
    """Programs written per sample: after a failed run the error is fed back (AFlow: 3)."""


class ScEnsembleParams(OpParams):
    pass


class MdEnsembleParams(OpParams):
    votes: int = Field(default=5, ge=1, le=MAX_VOTES)
    """Votes, each over a fresh shuffle of the candidates (MedPrompt: 5)."""


class ReviewParams(OpParams):
    pass


class ReviseParams(OpParams):
    pass


class PublicTestParams(OpParams):
    max_rounds: int = Field(default=3, ge=1, le=MAX_ROUNDS)
    """Fix attempts after failing public tests (AFlow's ``test_loop``: 3)."""


class FormatParams(OpParams):
    instruction: PromptRef = Field(default=None, pattern=NAME_PATTERN)
    """Name of a prompt-table entry saying what form the answer takes; none uses the default."""


class ReviseLoopParams(OpParams):
    max_rounds: int = Field(default=3, ge=1, le=MAX_ROUNDS)
    """Review/revise rounds at most; the loop stops early when a review passes."""


@dataclass(frozen=True)
class Slot:
    """One named input of an operator."""

    name: str
    many: bool
    """A list of references (joined or pooled) rather than exactly one."""
    accepts: frozenset[ValueKind]
    problem_ok: bool
    """Whether ``problem`` may be referenced here."""
    required: bool
    description: str


@dataclass(frozen=True)
class OpSpec:
    """Everything static about one operator."""

    name: OpName
    summary: str
    """One line for people and for the policy's observation."""
    interface: str
    """The call as a signature, AFlow-style."""
    slots: tuple[Slot, ...]
    params: type[OpParams]
    tasks: frozenset[TaskType]
    aflow_attr: str
    """Attribute name of the operator in an exported AFlow ``graph.py``."""
    generates: bool = False
    """Has ``samples`` (fan-out) and may read the problem."""

    def slot(self, name: str) -> Slot | None:
        return next((s for s in self.slots if s.name == name), None)

    @property
    def fan_out(self) -> str | None:
        """The parameter counting the node's independent draws (``samples`` of a generating
        node, ``votes`` of MdEnsemble), or None. Draw ``i`` does not depend on the count, so a
        node that grows keeps the draws it had (the evaluator reuses them)."""
        if self.generates:
            return "samples"
        return "votes" if self.name == "MdEnsemble" else None

    def output_kind(self, params: OpParams) -> ValueKind:
        if self.name == "Review":
            return "verdict"
        if self.generates and int(getattr(params, "samples", 1)) > 1:
            return "candidates"
        return "solution"

    def max_llm_calls(self, params: OpParams, n_candidates: int) -> int:
        """Most executor calls one run of the node makes (``n_candidates``: ensemble size)."""
        samples = int(getattr(params, "samples", 1))
        if self.name == "Programmer":
            return samples * int(getattr(params, "max_attempts", 1))
        if self.generates:
            return samples
        if self.name == "ScEnsemble":
            return 1 if n_candidates > 1 else 0
        if self.name == "MdEnsemble":
            return int(getattr(params, "votes", 1)) if n_candidates > 1 else 0
        if self.name == "Test":
            return int(getattr(params, "max_rounds", 1))
        if self.name == "ReviseLoop":
            return 2 * int(getattr(params, "max_rounds", 1))
        return 1


_TEXT: Final[frozenset[ValueKind]] = frozenset({"solution", "candidates"})
_ONE: Final[frozenset[ValueKind]] = frozenset({"solution"})


def _context_slot(name: str, description: str, *, required: bool = True) -> Slot:
    return Slot(name, True, _TEXT, True, required, description)


def _solution_slot(description: str) -> Slot:
    return Slot("solution", False, _ONE, False, True, description)


def _pool_slot() -> Slot:
    return Slot(
        "solutions",
        True,
        _TEXT,
        False,
        True,
        "candidate solutions, pooled in order (a candidates input adds all of its samples)",
    )


_SPECS: tuple[OpSpec, ...] = (
    OpSpec(
        name="Custom",
        summary="Ask the model anything: the instruction prompt followed by the inputs; returns "
        "its reply as is.",
        interface="custom(input: str, instruction: str) -> str",
        slots=(_context_slot("input", "texts shown to the model, in order"),),
        params=CustomParams,
        tasks=ALL_TASKS,
        aflow_attr="custom",
        generates=True,
    ),
    OpSpec(
        name="AnswerGenerate",
        summary="Reason step by step, then give a short final answer; returns only the answer.",
        interface="answer_generate(input: str) -> str",
        slots=(_context_slot("input", "texts shown to the model, in order"),),
        params=AnswerGenerateParams,
        tasks=frozenset({"math", "qa"}),
        aflow_attr="answer_generate",
        generates=True,
    ),
    OpSpec(
        name="CustomCodeGenerate",
        summary="Write the Python function the problem asks for (instruction prompt first); "
        "returns the code.",
        interface="custom_code_generate(problem: str, entry_point: str, instruction: str) -> str",
        slots=(_context_slot("input", "texts shown to the model, in order"),),
        params=CustomCodeGenerateParams,
        tasks=frozenset({"code"}),
        aflow_attr="custom_code_generate",
        generates=True,
    ),
    OpSpec(
        name="ScEnsemble",
        summary="Self-consistency: show the candidates labelled A, B, ... and pick the one "
        "most of them agree with.",
        interface="sc_ensemble(solutions: list[str], problem: str) -> str",
        slots=(_pool_slot(),),
        params=ScEnsembleParams,
        tasks=ALL_TASKS,
        aflow_attr="sc_ensemble",
    ),
    OpSpec(
        name="MdEnsemble",
        summary="MedPrompt ensemble: several votes, each over a fresh shuffle of the labelled "
        "candidates; the most voted candidate wins.",
        interface="md_ensemble(solutions: list[str], problem: str) -> str",
        slots=(_pool_slot(),),
        params=MdEnsembleParams,
        tasks=ALL_TASKS,
        aflow_attr="md_ensemble",
    ),
    OpSpec(
        name="Programmer",
        summary="Write a Python program with a solve() function, run it in the sandbox, "
        "retry with the error on failure; returns what solve() returned.",
        interface="programmer(problem: str, analysis: str) -> str",
        slots=(
            _context_slot("input", "texts describing the problem, in order"),
            Slot(
                "analysis",
                True,
                _TEXT,
                False,
                False,
                "optional reasoning to base the program on",
            ),
        ),
        params=ProgrammerParams,
        tasks=frozenset({"math", "qa"}),
        aflow_attr="programmer",
        generates=True,
    ),
    OpSpec(
        name="Test",
        summary="Run the solution against the problem's public tests in the sandbox; on "
        "failure ask for a fix with the failures shown, up to max_rounds times.",
        interface="test(problem: str, solution: str, entry_point: str) -> str",
        slots=(_solution_slot("code to test and fix"),),
        params=PublicTestParams,
        tasks=frozenset({"code"}),
        aflow_attr="test",
    ),
    OpSpec(
        name="Review",
        summary="Critically review one solution; returns a verdict (correct or not) with feedback.",
        interface="review(problem: str, solution: str) -> verdict",
        slots=(_solution_slot("the solution to review"),),
        params=ReviewParams,
        tasks=ALL_TASKS,
        aflow_attr="review",
    ),
    OpSpec(
        name="Revise",
        summary="Rewrite a solution following a review's feedback (unchanged when the review "
        "passed it).",
        interface="revise(problem: str, solution: str, feedback: str) -> str",
        slots=(
            _solution_slot("the solution to revise"),
            Slot("feedback", False, frozenset({"verdict"}), False, True, "a Review node"),
        ),
        params=ReviseParams,
        tasks=ALL_TASKS,
        aflow_attr="revise",
    ),
    OpSpec(
        name="Format",
        summary="Final extraction: restate the solution's final answer in the concise form "
        "the question asks for.",
        interface="format(problem: str, solution: str) -> str",
        slots=(_solution_slot("the solution to extract the answer from"),),
        params=FormatParams,
        tasks=frozenset({"math", "qa"}),
        aflow_attr="format",
    ),
    OpSpec(
        name="ReviseLoop",
        summary="Bounded review/revise loop: review the solution, revise it with the feedback, "
        "and repeat until a review passes or max_rounds is reached.",
        interface="for _ in range(max_rounds): review(...); if passed: break; revise(...)",
        slots=(_solution_slot("the solution to refine"),),
        params=ReviseLoopParams,
        tasks=ALL_TASKS,
        aflow_attr="review",
    ),
)

OPS: Final[Mapping[str, OpSpec]] = {spec.name: spec for spec in _SPECS}
"""Operator specs by name."""


def describe_operators(task_type: TaskType | None = None) -> str:
    """The operator list for people and for the policy's prompt (one operator per line)."""
    lines = []
    for spec in _SPECS:
        if task_type is not None and task_type not in spec.tasks:
            continue
        params = ", ".join(
            f"{name}={field.default!r}" for name, field in spec.params.model_fields.items()
        )
        lines.append(
            f"- {spec.name}: {spec.summary} Inputs: "
            + ", ".join(f"{s.name}{'' if s.required else '?'}" for s in spec.slots)
            + (f". Parameters: {params}." if params else ".")
        )
    return "\n".join(lines)
