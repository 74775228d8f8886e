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

(mean ± standard deviation over the evaluation's repeats). A run with several training
benchmarks makes one such table per benchmark. A held-out benchmark (never trained on) gets a
transfer table: the workflow each training benchmark of the same task type chose, tested on the
held-out benchmark as it is (nothing is chosen on held-out data), against its seed and
baselines. Used by :mod:`aflowrl.trainer.loop` when ``trainer.finalTestEval`` is on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from aflowrl._proto.v1 import environment_pb2
from aflowrl.trainer.clients import EnvironmentClient
from aflowrl.trainer.state import BestWorkflow
from aflowrl.workflow import Graph, library

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
    benchmark: str = ""
    """The benchmark the row was evaluated on."""
    held_out: bool = False
    """Whether that benchmark is held out (never trained on)."""

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
    held_out: bool = False,
) -> list[FinalRow]:
    """Pick the best candidate on the validation split, then test it with the baselines.

    On a ``held_out`` benchmark nothing is picked: every candidate is tested.
    """
    pool = [*candidates, *baselines]
    kwargs: dict[str, Any] = {"benchmark": benchmark, "repeats": repeats, "seed": seed}
    validation = await _evaluate(env, [c.graph for c in pool], split="validate", **kwargs)
    scores = [reply.summary.mean for reply in validation]
    chosen = list(baselines)
    if held_out:
        chosen[:0] = candidates
    elif candidates:
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
                benchmark=benchmark,
                held_out=held_out,
            )
        )
    return rows


def baselines(seed: Graph) -> list[Contender]:
    """The seed workflow and the classic baselines of its task type."""
    classic = [Contender(n, library.load(n, seed.task_type)) for n in library.CLASSIC]
    return [Contender("seed", seed), *classic]


def candidates(best: Sequence[BestWorkflow], seed: Graph) -> list[Contender]:
    """The kept best workflows whose graph is known, the seed left out (it is a baseline)."""
    return [
        Contender(f"best ({b.hash[:8]})", Graph.from_json(b.workflow_json, source=b.hash))
        for b in best
        if b.workflow_json is not None and b.hash != seed.content_hash
    ]


async def final_comparison(
    env: EnvironmentClient,
    best: Mapping[str, Sequence[BestWorkflow]],
    seeds: Mapping[str, Graph],
    *,
    training: Sequence[str],
    held_out: Sequence[str],
    repeats: int,
    seed: int,
) -> dict[str, list[FinalRow]]:
    """Benchmark -> its rows: each training benchmark's comparison (all at once), then each
    held-out benchmark's transfer table (module docstring)."""

    async def one(name: str, pool: Sequence[Contender], **kw: Any) -> list[FinalRow]:
        kept = baselines(seeds[name])
        return await compare(env, pool, kept, benchmark=name, repeats=repeats, seed=seed, **kw)

    pools = {name: candidates(best.get(name, ()), seeds[name]) for name in training}
    compared = await asyncio.gather(*(one(name, pools[name]) for name in training))
    out = dict(zip(training, compared, strict=True))
    chosen: dict[str, Graph] = {}
    for name, rows in out.items():
        by_hash = {c.graph.content_hash: c.graph for c in pools[name]}
        if rows and rows[0].hash in by_hash:
            chosen[name] = by_hash[rows[0].hash]
    for name in held_out:
        task_type = seeds[name].task_type
        transferred = [
            Contender(f"best of {source} ({graph.content_hash[:8]})", graph)
            for source, graph in chosen.items()
            if graph.task_type == task_type
        ]
        out[name] = await one(name, transferred, held_out=True)
    return out


def final_table(
    rows: Sequence[FinalRow], *, benchmark: str, split: str = "test", held_out: bool = False
) -> str:
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
    title = f"Best workflow vs the seed and classic baselines on {benchmark} ({split} split)"
    if held_out:
        title = (
            f"Held-out {benchmark} (never trained on): the workflows chosen on training "
            f"benchmarks of its task type vs its seed and classic baselines ({split} split)"
        )
    return aligned_table(title, header, body)


def best_against_baselines(rows: Sequence[FinalRow]) -> str | None:
    """One sentence: the run's best workflow against the strongest classic baseline on the test
    split, and, when it does not lead, the validation scores it was chosen by (nothing is chosen
    on test problems): when no kept workflow scored above the strongest baseline on validation,
    the sentence says so, since the choice could then not have found one that beats it. None
    when the table has no best workflow or no baseline."""
    best = next((row for row in rows if row.name.startswith("best")), None)
    classic = [row for row in rows if row.name in library.CLASSIC]
    if best is None or not classic:
        return None
    top = max(classic, key=lambda row: row.test_mean)
    where = f"on {best.benchmark}'s test split" if best.benchmark else "on the test split"
    if best.test_mean > top.test_mean:
        return (
            f"The best workflow found ({best.test_mean:.3f}) beats every classic baseline {where} "
            f"(the strongest, {top.name}: {top.test_mean:.3f})."
        )

    def validation(row: FinalRow) -> str:
        return "-" if row.validation_score is None else f"{row.validation_score:.3f}"

    scored = [row for row in classic if row.validation_score is not None]
    if best.validation_score is not None and scored:
        rival = max(scored, key=lambda row: row.validation_score or 0.0)
        if best.validation_score <= (rival.validation_score or 0.0):
            # The best is the candidates' top on validation: no kept workflow beat the rival.
            return (
                f"The best workflow found ({best.test_mean:.3f}) does not beat {top.name} "
                f"({top.test_mean:.3f}) {where}: no workflow the search kept scored above "
                f"{rival.name} on the validation split it is chosen on ({validation(best)} "
                f"against {validation(rival)})."
            )
    return (
        f"The best workflow found ({best.test_mean:.3f}) does not beat {top.name} "
        f"({top.test_mean:.3f}) {where}: it was chosen on validation problems, where it scored "
        f"{validation(best)} against {top.name}'s {validation(top)}."
    )


def aligned_table(title: str, header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A title, then columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(line[i]) for line in (header, *body)) for i in range(len(header))]

    def fmt(line: Sequence[str]) -> str:
        cells = [line[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(line[1:], widths[1:], strict=True)]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([title, "", fmt(header), rule, *(fmt(line) for line in body)])
