"""``aflowrl surrogate``: calibrate and serve the offline surrogate of the executor LLM.

``aflowrl surrogate calibrate --data-dir DIR --split test --json OUT`` runs the classic workflows
on the six benchmarks (3 seeds), prints measured next to target for each cell and writes them
as ``[{"benchmark", "workflow", "measured", "target", ...}]`` (percent). With ``--fit`` it first
fits the calibration's parameters (``--write FILE`` saves the result); with ``--check`` it exits
with status 1 when a cell is more than 3 points off.

``aflowrl surrogate serve --port P [--data-dir DIR] [--latency-ms L] [--model NAME ...]`` serves
the surrogate over the OpenAI API (``/v1/chat/completions``, ``/v1/models``) under the given
model names until SIGINT or SIGTERM; it prints ``{"base_url": ..., "port": ...}`` once
listening.
"""

from __future__ import annotations

import argparse
import sys

NAME = "surrogate"
HELP = "Calibrate or serve the offline surrogate executor (OpenAI-compatible)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from aflowrl.cli._help import HelpFormatter

    sub = parser.add_subparsers(dest="surrogate_command", metavar="ACTION", required=True)

    calibrate = sub.add_parser(
        "calibrate",
        formatter_class=HelpFormatter,
        help="measure (and with --fit, fit) the classic workflows against AFlow's Table 1",
        description="Run IO, CoT, CoT-SC, MedPrompt and Self-Refine on the benchmarks and print "
        "measured vs target scores (HotpotQA on its validation split: it has no test split).",
    )
    calibrate.add_argument("--data-dir", help="benchmark split files (default $AFLOWRL_DATA_DIR)")
    calibrate.add_argument("--split", default="test", choices=["validate", "test"])
    calibrate.add_argument("--json", metavar="OUT", help="write the cells as JSON here")
    calibrate.add_argument("--seeds", default="0,1,2", help="evaluation seeds, comma-separated")
    calibrate.add_argument(
        "--benchmarks",
        default="hotpotqa,drop,humaneval,mbpp,gsm8k,math",
        help="benchmarks, comma-separated",
    )
    calibrate.add_argument(
        "--workflows",
        default="io,cot,cot_sc,medprompt,self_refine",
        help="library workflows, comma-separated",
    )
    calibrate.add_argument("--calibration", help="calibration JSON (default: the shipped one)")
    calibrate.add_argument("--limit", type=int, help="only the first N problems of each split")
    calibrate.add_argument("--concurrency", type=int, default=32, help="problem runs at once")
    calibrate.add_argument("--fit", action="store_true", help="fit the parameters first")
    calibrate.add_argument("--rounds", type=int, default=8, help="most fitting rounds")
    calibrate.add_argument(
        "--tolerance", type=float, default=1.0, help="fit until every cell is this close (points)"
    )
    calibrate.add_argument("--write", metavar="FILE", help="save the fitted calibration here")
    calibrate.add_argument(
        "--check", action="store_true", help="exit 1 when a cell is more than 3 points off"
    )

    serve = sub.add_parser(
        "serve",
        formatter_class=HelpFormatter,
        help="serve the surrogate over the OpenAI HTTP API",
        description="Serve /v1/chat/completions and /v1/models until SIGINT or SIGTERM.",
    )
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0: all)")
    serve.add_argument("--data-dir", help="benchmark split files (default $AFLOWRL_DATA_DIR)")
    serve.add_argument("--latency-ms", type=float, default=0.0, help="simulated latency per call")
    serve.add_argument("--seed", type=int, default=0, help="the surrogate's own seed")
    serve.add_argument("--calibration", help="calibration JSON (default: the shipped one)")
    serve.add_argument(
        "--model",
        action="append",
        metavar="NAME",
        help="a model name to serve (repeat for several, e.g. --model surrogate --model "
        "gpt-4o-mini; default surrogate); requests for other names get 404 model_not_found",
    )


def _integers(text: str, field: str) -> list[int]:
    from aflowrl.errors import InvalidInputError

    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InvalidInputError(f"{text!r} is not a list of integers", field=field) from None
    if not values:
        raise InvalidInputError("give at least one", field=field)
    return values


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def run(args: argparse.Namespace) -> int:
    if args.surrogate_command == "serve":
        return _serve(args)
    return _calibrate(args)


def _serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from aflowrl import envs
    from aflowrl.common.logging import setup_logging
    from aflowrl.errors import InvalidInputError
    from aflowrl.executor.surrogate import SurrogateExecutor
    from aflowrl.executor.surrogate.server import SurrogateServer, serve_until_signal

    if not 0 <= args.port <= 65535:
        raise InvalidInputError("must be in 0..65535", field="--port")
    setup_logging(envs.AFLOWRL_LOG_LEVEL, envs.AFLOWRL_LOG_FORMAT, component="surrogate")
    logging.getLogger(__name__).info("loading benchmark problems")
    models = args.model or ["surrogate"]
    if any(not name.strip() for name in models) or len(set(models)) != len(models):
        raise InvalidInputError("model names must be non-empty and distinct", field="--model")
    executor = SurrogateExecutor(
        data_dir=args.data_dir,
        calibration=args.calibration,
        seed=args.seed,
        latency_ms=args.latency_ms,
        model=models[0],
    )
    server = SurrogateServer(executor, host=args.host, port=args.port, models=models)
    asyncio.run(serve_until_signal(server))
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    import asyncio
    import json
    from pathlib import Path

    from aflowrl.benchmarks import BENCHMARK_NAMES
    from aflowrl.cli import surrogate_calibration as fitting
    from aflowrl.errors import InvalidInputError
    from aflowrl.executor.surrogate import SurrogateExecutor, load_calibration, load_problems
    from aflowrl.workflow import library

    seeds = _integers(args.seeds, "--seeds")
    benchmarks = _names(args.benchmarks)
    workflows = _names(args.workflows)
    unknown = [b for b in benchmarks if b not in BENCHMARK_NAMES]
    if unknown:
        raise InvalidInputError(f"unknown benchmarks {unknown}", field="--benchmarks")
    unknown = [w for w in workflows if w not in library.NAMES]
    if unknown:
        raise InvalidInputError(f"unknown workflows {unknown}", field="--workflows")
    if args.limit is not None and args.limit < 1:
        raise InvalidInputError("must be at least 1", field="--limit")
    calibration = load_calibration(args.calibration)
    problems = load_problems(args.data_dir)

    def executor_for(current: object) -> SurrogateExecutor:
        return SurrogateExecutor(problems, calibration=current)  # type: ignore[arg-type]

    def progress(cell: fitting.Cell) -> None:
        target = "" if cell.target is None else f" (target {cell.target:.1f})"
        print(f"  {cell.benchmark} {cell.workflow}: {cell.measured:.2f}{target}", file=sys.stderr)

    if args.fit:
        calibration, report = asyncio.run(
            fitting.fit(
                executor_for,
                calibration,
                data_dir=args.data_dir,
                split=args.split,
                benchmarks=benchmarks,
                seeds=seeds,
                rounds=args.rounds,
                tolerance=args.tolerance,
                concurrency=args.concurrency,
                limit=args.limit,
                progress=progress,
            )
        )
        cells = report.cells
        print(
            "fit: largest residual per round: " + ", ".join(f"{r:.2f}" for r in report.rounds),
            file=sys.stderr,
        )
        if args.write:
            out = Path(args.write)
            out.parent.mkdir(parents=True, exist_ok=True)
            fitted = fitting.with_fit_notes(calibration, report, args.split, seeds)
            out.write_text(fitted.to_json(), encoding="utf-8")
            print(f"wrote {out}", file=sys.stderr)
    else:
        cells = asyncio.run(
            fitting.measure(
                executor_for(calibration),
                data_dir=args.data_dir,
                split=args.split,
                benchmarks=benchmarks,
                workflows=workflows,
                seeds=seeds,
                concurrency=args.concurrency,
                limit=args.limit,
                progress=progress,
            )
        )
    print(fitting.table(cells))
    if any(c.split != args.split for c in cells):
        print(
            f"note: hotpotqa has no {args.split} split in AFlow's data; measured on validate",
            file=sys.stderr,
        )
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps([c.to_row() for c in cells], indent=2) + "\n")
        print(f"wrote {out}", file=sys.stderr)
    if args.check and any(abs(c.residual) > fitting.TOLERANCE for c in cells):
        return 1
    return 0
