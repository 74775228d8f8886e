"""The run's last word: the best workflow against the seed and the classic baselines, on test.

Each workflow (the best ones found, the benchmark's seed, and AFlow's classic baselines IO, CoT,
CoT-SC, MedPrompt and Self-Refine from :mod:`aflowrl.workflow.library`) is evaluated on the
benchmark's test split through the environment service's ``Evaluate`` (routed by workflow hash,
all in parallel, seeded by ``trainer.seed``), and the results become a table::

    workflow            test score      validation  problems  executor calls  cost (USD)
    best 1 (3fa2c1d9)   0.912 ± 0.010   0.950       131       1,310          0.0123
    seed                0.851 ± 0.004   0.850       ...

Used by :mod:`aflowrl.trainer.loop` when ``trainer.finalTestEval`` is on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from aflowrl._proto.v1 import environment_pb2
from aflowrl.trainer.routing import EnvironmentClient
from aflowrl.workflow import Graph

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Contender:
    """A workflow in the final comparison."""

    name: str
    graph: Graph
    validation_score: float | None = None


@dataclass(frozen=True)
class FinalRow:
    name: str
    hash: str
    test_mean: float
    test_std: float
    num_problems: int
    validation_score: float | None
    executor_calls: int
    cache_hits: int
    cost_usd: float | None
    latency_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def evaluate_contenders(
    env: EnvironmentClient,
    contenders: Sequence[Contender],
    *,
    benchmark: str,
    repeats: int,
    seed: int,
    split: str = "test",
) -> list[FinalRow]:
    """Evaluate every contender on ``split`` (in parallel); rows in the contenders' order."""

    async def one(contender: Contender) -> FinalRow:
        request = environment_pb2.EvaluateRequest(
            workflow_json=contender.graph.to_json(indent=None),
            benchmark=benchmark,
            split=split,
            repeats=repeats,
            seed=seed,
        )
        reply = await env.evaluate(request, key=contender.graph.content_hash)
        summary = reply.summary
        return FinalRow(
            name=contender.name,
            hash=reply.workflow_hash or contender.graph.content_hash,
            test_mean=summary.mean,
            test_std=summary.std,
            num_problems=summary.num_problems,
            validation_score=contender.validation_score,
            executor_calls=summary.executor_calls,
            cache_hits=summary.cache_hits,
            cost_usd=summary.cost_usd if summary.cost_known else None,
            latency_s=summary.latency_s,
        )

    return list(await asyncio.gather(*(one(c) for c in contenders)))


def final_table(rows: Sequence[FinalRow], *, benchmark: str, split: str = "test") -> str:
    """The comparison as an aligned text table (module docstring)."""
    header = (
        "workflow",
        f"{split} score",
        "validation",
        "problems",
        "executor calls",
        "cost (USD)",
    )
    body = [
        (
            row.name,
            f"{row.test_mean:.3f} ± {row.test_std:.3f}",
            "-" if row.validation_score is None else f"{row.validation_score:.3f}",
            str(row.num_problems),
            f"{row.executor_calls:,}",
            "unknown" if row.cost_usd is None else f"{row.cost_usd:.4f}",
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in (header, *body)) for i in range(len(header))]

    def fmt(line: Sequence[str]) -> str:
        cells = [line[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(line[1:], widths[1:], strict=True)]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    title = f"Best workflow vs the seed and classic baselines on {benchmark} ({split} split)"
    return "\n".join([title, "", fmt(header), rule, *(fmt(line) for line in body)])
