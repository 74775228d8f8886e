"""The run's last word: the best workflow found against the seed and the classic baselines.

Validation scores seen during training are noisy: each episode scores workflows on its own
subset of ``environment.evaluation.maxProblems`` problems. So the best workflows the run kept
(:attr:`aflowrl.trainer.state.TrainerState.best`) are first evaluated, with the seed and the
classic baselines (IO, CoT, CoT-SC, MedPrompt, Self-Refine from
:mod:`aflowrl.workflow.library`), on the whole validation split; the one that scores best there
is the run's best workflow, and it, the seed and the baselines are evaluated on the test split.
Every evaluation goes through the environment service's ``Evaluate`` (routed by workflow hash,
all in parallel, seeded by ``trainer.seed``). The result is a table::

    workflow            test score      validation  problems  executor calls  cost (USD)
    best (3fa2c1d9)     0.912 ± 0.010   0.950       131       1,310          0.0123
    seed                0.851 ± 0.004   0.850       ...

(mean ± standard deviation over the evaluation's repeats). Used by :mod:`aflowrl.trainer.loop`
when ``trainer.finalTestEval`` is on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from aflowrl._proto.v1 import environment_pb2
from aflowrl.trainer.clients import EnvironmentClient
from aflowrl.workflow import Graph

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Contender:
    """A workflow in the final comparison."""

    name: str
    graph: Graph


@dataclass(frozen=True)
class FinalRow:
    name: str
    hash: str
    test_mean: float
    test_std: float
    num_problems: int
    validation_score: float | None
    """Mean score on the whole validation split."""
    executor_calls: int
    cache_hits: int
    cost_usd: float | None
    latency_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def _evaluate(
    env: EnvironmentClient,
    graphs: Sequence[Graph],
    *,
    benchmark: str,
    split: str,
    repeats: int,
    seed: int,
) -> list[environment_pb2.EvaluateResponse]:
    async def one(graph: Graph) -> environment_pb2.EvaluateResponse:
        request = environment_pb2.EvaluateRequest(
            workflow_json=graph.to_json(indent=None),
            benchmark=benchmark,
            split=split,
            repeats=repeats,
            seed=seed,
        )
        return await env.evaluate(request, key=graph.content_hash)

    return list(await asyncio.gather(*(one(g) for g in graphs)))


async def compare(
    env: EnvironmentClient,
    candidates: Sequence[Contender],
    baselines: Sequence[Contender],
    *,
    benchmark: str,
    repeats: int,
    seed: int,
) -> list[FinalRow]:
    """Pick the best candidate on the validation split, then test it with the baselines."""
    pool = [*candidates, *baselines]
    kwargs: dict[str, Any] = {"benchmark": benchmark, "repeats": repeats, "seed": seed}
    validation = await _evaluate(env, [c.graph for c in pool], split="validate", **kwargs)
    scores = [reply.summary.mean for reply in validation]
    chosen = list(baselines)
    if candidates:
        best = max(range(len(candidates)), key=lambda i: (scores[i], -i))
        chosen.insert(0, candidates[best])
        logger.info(
            "best workflow on the validation split: %s (%.3f)",
            candidates[best].name,
            scores[best],
        )
    by_hash = {c.graph.content_hash: s for c, s in zip(pool, scores, strict=True)}
    tests = await _evaluate(env, [c.graph for c in chosen], split="test", **kwargs)
    rows = []
    for contender, reply in zip(chosen, tests, strict=True):
        summary = reply.summary
        rows.append(
            FinalRow(
                name=contender.name,
                hash=reply.workflow_hash or contender.graph.content_hash,
                test_mean=summary.mean,
                test_std=summary.std,
                num_problems=summary.num_problems,
                validation_score=by_hash.get(contender.graph.content_hash),
                executor_calls=summary.executor_calls,
                cache_hits=summary.cache_hits,
                cost_usd=summary.cost_usd if summary.cost_known else None,
                latency_s=summary.latency_s,
            )
        )
    return rows


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
