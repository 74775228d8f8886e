"""What one workflow run carries: settings, the code runner, seeds, the trace and the bill.

:class:`RunContext` is created by the interpreter for one problem; operators call
:meth:`RunContext.llm` and :meth:`RunContext.run_code`, which record every executor call and
sandbox run as a :class:`TraceEvent` and add up tokens and cost. Seeds of calls derive from the
run's seed and the node's *canonical* position (never its id), so renamed copies of a graph make
identical requests.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

from aflowrl.benchmarks.base import TaskType
from aflowrl.executor.base import Executor, Message, Usage
from aflowrl.sandbox import SandboxResult
from aflowrl.seeding import derive_seed
from aflowrl.workflow.graph import Graph, Node


class CodeRunner(Protocol):
    """Runs Python in isolation: ``aflowrl.sandbox.arun_python`` (the default)."""

    def __call__(
        self, code: str, *, timeout_s: float, memory_mb: int
    ) -> Awaitable[SandboxResult]: ...


@dataclass(frozen=True)
class RunSettings:
    """How operators call the executor and the sandbox."""

    temperature: float | None = None
    """Sampling temperature of every call; None leaves the executor's default."""
    max_tokens: int | None = None
    """Most completion tokens per call; None leaves the executor's default."""
    code_timeout_s: float = 10.0
    """Wall-clock limit of one sandbox run (a Programmer program or a public-test run)."""
    code_memory_mb: int = 512
    """Memory limit of one sandbox run."""

    def fingerprint(self) -> str:
        """What of these settings changes answers (part of the evaluation cache key)."""
        return f"t={self.temperature};max_tokens={self.max_tokens};code_s={self.code_timeout_s}"


@dataclass(frozen=True)
class Verdict:
    """A Review's judgement of one solution."""

    passed: bool
    feedback: str


@dataclass(frozen=True)
class TraceEvent:
    """One thing that happened in a run: an executor call, a sandbox run, or a note."""

    node: str
    op: str
    kind: Literal["llm", "sandbox", "note"]
    sample: int = 0
    step: int = 0
    """Order of the call within its node and sample (loop rounds, retries)."""
    prompt: str | None = None
    response: str | None = None
    parsed: str | None = None
    """What the operator took from the response (an answer, a letter, code...)."""
    error: str | None = None
    status: str | None = None
    """Sandbox status (ok, error, timeout, killed)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    latency_s: float = 0.0
    seed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class RunContext:
    """State of one run of a graph on one problem (created by the interpreter)."""

    graph: Graph
    executor: Executor
    code_runner: CodeRunner
    settings: RunSettings
    question: str
    entry_point: str | None
    public_tests: tuple[str, ...]
    seed: int
    node_index: Mapping[str, int]
    trace: list[TraceEvent] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = 0.0
    llm_calls: int = 0
    sandbox_runs: int = 0
    _steps: dict[tuple[str, int], int] = field(default_factory=dict)

    @property
    def task_type(self) -> TaskType:
        return self.graph.task_type

    def prompt_text(self, name: str | None) -> str | None:
        return None if name is None else self.graph.prompts[name]

    def _next_step(self, node: Node, sample: int) -> int:
        key = (node.id, sample)
        step = self._steps.get(key, 0)
        self._steps[key] = step + 1
        return step

    def call_seed(self, node: Node, sample: int, step: int) -> int:
        return derive_seed(self.seed, self.node_index[node.id], sample, step)

    def note(self, node: Node, message: str, *, sample: int = 0) -> None:
        self.trace.append(TraceEvent(node.id, node.op, "note", sample=sample, error=message))

    async def llm(self, node: Node, sample: int, prompt: str) -> tuple[str, TraceEvent]:
        """One executor call with one user message; returns the text and its trace event.

        Executor errors propagate: an unreachable executor is not a wrong answer.
        """
        step = self._next_step(node, sample)
        seed = self.call_seed(node, sample, step)
        started = time.perf_counter()
        result = await self.executor.chat(
            [Message("user", prompt)],
            n=1,
            temperature=self.settings.temperature,
            max_tokens=self.settings.max_tokens,
            seed=seed,
        )
        text = result.texts[0] if result.texts else ""
        self.llm_calls += 1
        self.usage = self.usage + result.usage
        if self.cost_usd is not None and result.cost_usd is not None:
            self.cost_usd += result.cost_usd
        else:
            self.cost_usd = None
        event = TraceEvent(
            node.id,
            node.op,
            "llm",
            sample=sample,
            step=step,
            prompt=prompt,
            response=text,
            prompt_tokens=result.usage.prompt_tokens,
            completion_tokens=result.usage.completion_tokens,
            cost_usd=result.cost_usd,
            latency_s=result.latency_s or time.perf_counter() - started,
            seed=seed,
        )
        self.trace.append(event)
        return text, event

    def record(self, event: TraceEvent, **changes: Any) -> None:
        """Replace a recorded event with a copy carrying ``changes`` (parsed value, error)."""
        index = next(i for i, e in enumerate(self.trace) if e is event)
        self.trace[index] = TraceEvent(**{**asdict(event), **changes})

    async def run_code(self, node: Node, sample: int, code: str, purpose: str) -> SandboxResult:
        """Run code in the sandbox and trace it."""
        result = await self.code_runner(
            code, timeout_s=self.settings.code_timeout_s, memory_mb=self.settings.code_memory_mb
        )
        self.sandbox_runs += 1
        self.trace.append(
            TraceEvent(
                node.id,
                node.op,
                "sandbox",
                sample=sample,
                parsed=purpose,
                status=result.status,
                response=(result.stdout[-2000:] + result.stderr[-2000:]) or None,
                latency_s=result.duration_s,
            )
        )
        return result
