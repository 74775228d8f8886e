"""What one workflow run carries: settings, the code runner, seeds, draws, the trace and the bill.

:class:`RunContext` is created by the interpreter for one problem; operators call
:meth:`RunContext.llm` and :meth:`RunContext.run_code`, which record every executor call and
sandbox run as a :class:`TraceEvent` and add up what the run paid (:class:`Bill`).

Seeds: a node's calls derive their seeds from the run's seed and the node's *canonical
position* (``UpstreamHash.position`` of :func:`aflowrl.workflow.canonical.upstream_hashes`),
never from its id, its content or the order calls happen in. So renamed copies of a graph make
identical requests, and a workflow that differs from its parent only in a prompt draws with the
parent's random numbers: the score change a prompt edit earns is the prompt's effect on the same
draws, not sampling noise (common random numbers). Draws are stored under the node's own
content (operator, parameters, instruction), its position and the values its inputs carry in the
run (:meth:`aflowrl.workflow.canonical.UpstreamHash.key`), so any other workflow that feeds the
same texts to the same node at the same position reuses them, exactly, whatever produced those
texts.

Draws: operators wrap each independent piece of work in :meth:`RunContext.draw` (one fan-out
sample, one MedPrompt vote, or a whole node for the other operators). With a :class:`DrawStore`
(the evaluator's node cache), a draw made before for the same node content, position, input
values, problem, sample index and executor settings is taken as it was, with no executor call;
its value is exactly what running it again would give with a deterministic executor, because its
prompts and seeds are functions of the same key. :meth:`RunContext.bind_inputs` fixes a node's
key once its inputs are known (:func:`aflowrl.workflow.operators.run_node` calls it first).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

from aflowrl.benchmarks.base import TaskType
from aflowrl.executor.base import Executor, Message, Usage
from aflowrl.sandbox import SandboxResult
from aflowrl.seeding import derive_seed
from aflowrl.workflow.cache import StoredDraw
from aflowrl.workflow.canonical import UpstreamHash
from aflowrl.workflow.errors import OperatorOutputError
from aflowrl.workflow.graph import Graph, Node
from aflowrl.workflow.ops import PROBLEM


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
        """What of these settings changes answers (part of the evaluation cache key).

        ``seeds=3`` names how calls derive their seeds (canonical positions; draws stored by
        upstream content and position): episodes scored under earlier rules are refused rather
        than continued with other draws.
        """
        return (
            f"t={self.temperature};max_tokens={self.max_tokens};code_s={self.code_timeout_s}"
            f";code_mb={self.code_memory_mb};seeds=3"
        )


@dataclass(frozen=True)
class Verdict:
    """A Review's judgement of one solution."""

    passed: bool
    feedback: str


Value = str | tuple[str, ...] | Verdict
"""What flows along an edge: a solution, candidates, or a review's verdict."""

DrawValue = Value | int | None
"""What one draw gives: a node's value, a vote's choice (an index), or None (unusable output)."""


@dataclass(frozen=True)
class Bill:
    """What some work cost: executor calls, sandbox runs, tokens, USD (None: a price unknown)."""

    llm_calls: int = 0
    sandbox_runs: int = 0
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = 0.0

    def __add__(self, other: Bill) -> Bill:
        cost = (
            None
            if self.cost_usd is None or other.cost_usd is None
            else math.fsum((self.cost_usd, other.cost_usd))
        )
        return Bill(
            self.llm_calls + other.llm_calls,
            self.sandbox_runs + other.sandbox_runs,
            self.usage + other.usage,
            cost,
        )

    @staticmethod
    def of(events: Iterable[TraceEvent]) -> Bill:
        """The bill of traced executor calls and sandbox runs."""
        total = Bill()
        for event in events:
            if event.kind == "llm":
                usage = Usage(event.prompt_tokens, event.completion_tokens)
                total = total + Bill(1, 0, usage, event.cost_usd)
            elif event.kind == "sandbox":
                total = total + Bill(0, 1)
        return total

    @staticmethod
    def of_draw(draw: StoredDraw) -> Bill:
        usage = Usage(draw.prompt_tokens, draw.completion_tokens)
        return Bill(draw.llm_calls, draw.sandbox_runs, usage, draw.cost_usd)


class DrawStore(Protocol):
    """Node draws shared across runs of one problem and sample (the evaluator's node cache)."""

    async def draw(
        self, draw: str, make: Callable[[], Awaitable[StoredDraw]]
    ) -> tuple[StoredDraw, bool]:
        """The stored draw ``draw`` (and True), or the one ``make`` makes now (and False)."""
        ...


@dataclass(frozen=True)
class TraceEvent:
    """One thing that happened in a run: an executor call, a sandbox run, a note, or a draw
    reused from an earlier run (``reused``: no call made; ``response`` holds its value)."""

    node: str
    op: str
    kind: Literal["llm", "sandbox", "note", "reused"]
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
    upstream: Mapping[str, UpstreamHash]
    """Node id -> hashes of its upstream subgraph (seeds and draw keys derive from them)."""
    draws: DrawStore | None = None
    """Where draws are reused from and kept; None runs everything."""
    trace: list[TraceEvent] = field(default_factory=list)
    fresh: Bill = field(default_factory=Bill)
    """What this run paid: the calls it made."""
    reused: Bill = field(default_factory=Bill)
    """What the draws it reused cost when they were made."""
    _steps: dict[tuple[str, int], int] = field(default_factory=dict)
    _draw_keys: dict[str, str] = field(default_factory=dict)

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

    def bind_inputs(self, node: Node, values: Mapping[str, Value]) -> None:
        """Fix the key ``node``'s draws are stored under from the values of its inputs
        (``values``: reference -> value, as the node runs on them)."""
        inputs = {
            slot: [ref if ref == PROBLEM else _encode(values[ref]) for ref in refs]
            for slot, refs in node.inputs.items()
        }
        self._draw_keys[node.id] = self.upstream[node.id].key(inputs)

    def draw_hash(self, node: Node) -> str:
        """The key a node's draws are stored under (its content, its position and the values
        of its inputs: :meth:`bind_inputs`)."""
        try:
            return self._draw_keys[node.id]
        except KeyError:
            raise RuntimeError(f"node {node.id!r} drew before its inputs were bound") from None

    def position(self, node: Node) -> int:
        """The node's canonical position, which its calls are seeded by (never its id or
        content: :class:`~aflowrl.workflow.canonical.UpstreamHash`)."""
        return self.upstream[node.id].position

    def call_seed(self, node: Node, sample: int, step: int) -> int:
        """Seed of call ``step`` of draw ``sample`` of ``node``."""
        return derive_seed(self.seed, self.position(node), sample, step)

    async def draw(
        self, node: Node, index: int | None, make: Callable[[], Awaitable[DrawValue]]
    ) -> DrawValue:
        """One draw of ``node``: sample or vote ``index``, or the whole node (None).

        Reused from the draw store when it was made before (traced as ``reused``); else made by
        ``make``, whose executor calls and sandbox runs (traced under this node and, for an
        index, that sample) are its bill. An :class:`OperatorOutputError` is a result too: it
        is stored, and raised again, naming this node, whenever the draw is reused.
        """
        if self.draws is None:
            return await make()
        key = self.draw_hash(node) if index is None else f"{self.draw_hash(node)}/{index}"

        async def fresh() -> StoredDraw:
            try:
                value = _encode(await make())
            except OperatorOutputError as exc:
                value = {"failed": exc.reason}
            bill = Bill.of(
                e for e in self.trace if e.node == node.id and (index is None or e.sample == index)
            )
            return StoredDraw(
                value=value,
                llm_calls=bill.llm_calls,
                sandbox_runs=bill.sandbox_runs,
                prompt_tokens=bill.usage.prompt_tokens,
                completion_tokens=bill.usage.completion_tokens,
                cost_usd=bill.cost_usd,
            )

        stored, reused = await self.draws.draw(key, fresh)
        if reused:
            bill = Bill.of_draw(stored)
            self.reused = self.reused + bill
            self.trace.append(
                TraceEvent(
                    node.id,
                    node.op,
                    "reused",
                    sample=index or 0,
                    response=json.dumps(stored.value, ensure_ascii=False)[:2000],
                    prompt_tokens=bill.usage.prompt_tokens,
                    completion_tokens=bill.usage.completion_tokens,
                    cost_usd=bill.cost_usd,
                )
            )
        if "failed" in stored.value:
            raise OperatorOutputError(node.id, node.op, str(stored.value["failed"]))
        return _decode(stored.value)

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
        self.fresh = self.fresh + Bill(1, 0, result.usage, result.cost_usd)
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
        self.fresh = self.fresh + Bill(0, 1)
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


def _encode(value: DrawValue) -> dict[str, Any]:
    """A draw's value as tagged JSON (what the draw store keeps)."""
    if value is None:
        return {"unusable": True}
    if isinstance(value, str):
        return {"text": value}
    if isinstance(value, bool):  # never produced; bool is an int and must not pass as one
        raise TypeError("a draw is never a bool")
    if isinstance(value, int):
        return {"choice": value}
    if isinstance(value, tuple):
        return {"texts": list(value)}
    return {"verdict": {"passed": value.passed, "feedback": value.feedback}}


def _decode(doc: Mapping[str, Any]) -> DrawValue:
    if "text" in doc:
        return str(doc["text"])
    if "choice" in doc:
        return int(doc["choice"])
    if "texts" in doc:
        return tuple(str(t) for t in doc["texts"])
    if "verdict" in doc:
        verdict = doc["verdict"]
        return Verdict(bool(verdict["passed"]), str(verdict["feedback"]))
    if doc.get("unusable"):
        return None
    raise ValueError(f"not a stored draw: {sorted(doc)}")
