"""``aflowrl train``: train a workflow-optimizer policy with RL.

Two modes (CONTRACTS.md):

- **local** (no service targets): ``aflowrl train [-f run.yaml] [--run-dir DIR]`` checks the
  run's inputs, starts every service here as a child process (:mod:`aflowrl.local`), trains with
  a live progress bar, prints the final comparison table and stops the services. Without ``-f``
  it runs ``--preset NAME``, by default the embedded default run (the ``default`` preset, what
  ``aflowrl spec default`` prints: the tiny policy, the surrogate executor, MATH).
- **against running services** (what the trainer Job runs): ``aflowrl train -f FILE --env T
  --rollout T --learner T --run-dir DIR``; status goes to the TrainingRun, metrics to /metrics.

An existing run directory is resumed from its last checkpoint. Exit status: 0 done, 2 bad input
(found before any work starts), 1 a failure while running, 130 / 143 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from aflowrl.cli.spec import add_preset_argument

NAME = "train"
HELP = "Train a policy with RL: locally (every service started here) or against a run's services."

_TARGETS = (("env", "--env"), ("rollout", "--rollout"), ("learner", "--learner"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from aflowrl.cli._help import add_file_argument

    add_file_argument(
        parser,
        "RunSpec file (bare spec or TrainingRun); default $AFLOWRL_SPEC_FILE, else --preset, "
        "else the embedded default run (what 'aflowrl spec default' prints: tiny policy, "
        "surrogate executor, MATH)",
    )
    add_preset_argument(parser)
    for name, flag in _TARGETS:
        parser.add_argument(
            flag,
            dest=name,
            help=f"gRPC target of the {name} service; give all three to train against running "
            "services, none to start everything here",
        )
    parser.add_argument(
        "--run-dir",
        help="directory of the run's files; an existing run is resumed (default: "
        "runs/<date>-<time> locally, trainer.checkpointDir against services)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="HTTP /metrics port of the trainer (default: monitoring.metricsPort against "
        "services; none locally)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar: one log line per iteration"
    )


def run(args: argparse.Namespace) -> int:
    import asyncio

    from aflowrl import envs
    from aflowrl.cli._io import load_spec
    from aflowrl.errors import InvalidInputError

    given = [flag for name, flag in _TARGETS if getattr(args, name)]
    if given and len(given) < len(_TARGETS):
        missing = [flag for name, flag in _TARGETS if not getattr(args, name)]
        raise InvalidInputError(
            "give all of --env, --rollout and --learner (train against running services), or "
            "none (start everything here)",
            field=", ".join(missing),
        )
    if args.preset and args.spec:
        raise InvalidInputError("give a run file or a preset, not both", field="--preset")
    path = args.spec or (None if args.preset else envs.AFLOWRL_SPEC_FILE)
    if path is None:
        from aflowrl import presets

        spec = presets.load(args.preset or presets.DEFAULT)
    else:
        spec = load_spec(path)
    work = _against_services(spec, args) if given else _local(spec, args)
    try:
        return asyncio.run(_until_sigterm(work))
    except asyncio.CancelledError:
        print("aflowrl train: stopped (SIGTERM); the services were stopped", file=sys.stderr)
        return 143


async def _until_sigterm(work: Any) -> int:
    """Run ``work``; SIGTERM cancels it, so every ``finally`` (stopping children) runs."""
    import asyncio
    import signal

    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return int(await work)
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def _progress(spec: Any, args: argparse.Namespace, *, echo: bool = False) -> Any:
    from aflowrl.trainer.progress import Progress

    enabled = False if args.no_progress else None
    return Progress(spec.trainer.iterations, enabled=enabled, echo=echo)


def _local(spec: Any, args: argparse.Namespace) -> Any:
    """Check the inputs and set up the run directory now; the coroutine runs the rest."""
    import time

    from aflowrl.common.logging import setup_logging
    from aflowrl.local import preflight
    from aflowrl.local.launcher import local_spec

    run_dir = Path(args.run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
    spec = local_spec(spec, run_dir)
    preflight.check_local_run(spec)
    run_dir.mkdir(parents=True, exist_ok=True)
    log_file = run_dir / "logs" / "trainer.log"
    setup_logging(spec.monitoring.log_level, "text", component="trainer", file=log_file)
    tasks = ", ".join(spec.environment.training_benchmarks)
    if spec.environment.held_out_benchmarks:
        tasks += f" (held out: {', '.join(spec.environment.held_out_benchmarks)})"
    print(
        f"aflowrl train: run directory {run_dir} (service logs in {run_dir / 'logs'}); "
        f"{spec.trainer.iterations} iterations of {spec.trainer.tasks_per_iteration} x "
        f"{spec.trainer.group_size} episodes on {tasks}",
        file=sys.stderr,
    )
    return _train_local(spec, run_dir, log_file, args)


async def _train_local(spec: Any, run_dir: Path, log_file: Path, args: argparse.Namespace) -> int:
    from aflowrl.errors import AflowRLError
    from aflowrl.local.run import run_local

    # The log goes to a file: without a bar, the iteration lines are printed here too.
    with _progress(spec, args, echo=True) as progress:
        try:
            result = await run_local(
                spec, run_dir, progress=progress, metrics_port=args.metrics_port
            )
        except AflowRLError as exc:
            progress.close()
            print(f"aflowrl train: error: {exc}\n(see {log_file})", file=sys.stderr)
            return 1
    _report(result)
    return 0


def _against_services(spec: Any, args: argparse.Namespace) -> Any:
    from aflowrl import envs
    from aflowrl.common.logging import setup_logging

    fmt = "json" if "json" in (envs.AFLOWRL_LOG_FORMAT, spec.monitoring.log_format) else "text"
    setup_logging(spec.monitoring.log_level, fmt, component="trainer")
    run_dir = Path(args.run_dir or spec.trainer.checkpoint_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return _train_against_services(spec, run_dir, args)


async def _train_against_services(spec: Any, run_dir: Path, args: argparse.Namespace) -> int:
    from aflowrl.trainer import app

    await app.wait_for_services(spec, env=args.env, rollout=args.rollout, learner=args.learner)
    services = app.connect(spec, env=args.env, rollout=args.rollout, learner=args.learner)
    metrics_port = args.metrics_port
    if metrics_port is None:
        metrics_port = spec.monitoring.metrics_port
    with _progress(spec, args) as progress:
        result = await app.train(
            spec, services, run_dir, progress=progress, metrics_port=metrics_port
        )
    _report(result)
    return 0


def _report(result: Any) -> None:
    """The final table and where the run's files are."""
    run_dir = result.run_dir
    if result.final_table:
        print(result.final_table)
    if result.best_dir is not None:
        print(f"\nbest workflow (JSON, AFlow graph.py + prompt.py, picture): {result.best_dir}")
    elif result.best_dirs:
        print("\nbest workflows (JSON, AFlow graph.py + prompt.py, picture):")
        for benchmark, folder in result.best_dirs.items():
            print(f"  {benchmark}: {folder}")
    print(f"metrics: {run_dir / 'metrics.jsonl'}   curves: {run_dir / 'curves.png'}")
