"""The ``aflowrl`` command line.

Each command lives in its own module of this package, exposing ``NAME``, ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``. Modules import only argparse-level things at
import time, so ``aflowrl --help`` stays instant; heavy imports (torch, grpc servers) happen inside
``run``. Errors end a command with one line on stderr and the exit status
:mod:`aflowrl.cli.exitcodes` defines (2: bad input, naming the problem; 3: the executor).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from aflowrl import __version__

COMMAND_MODULES: tuple[str, ...] = (
    # one per line, so parallel additions merge cleanly
    "crd",
    "spec",
    "eval",
    "optimize",
    "model",
    "serve",
    "surrogate",
    "train",
    "data",
    "plot",
    "show",
)
"""Modules of ``aflowrl.cli`` that define commands, in ``--help`` order."""


def _commands() -> list[ModuleType]:
    return [importlib.import_module(f"aflowrl.cli.{name}") for name in COMMAND_MODULES]


def build_parser() -> argparse.ArgumentParser:
    from aflowrl.cli._help import HelpFormatter

    parser = argparse.ArgumentParser(
        prog="aflowrl",
        description="Train LLMs with RL (GiGPO) to design agentic workflows.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"aflow-rl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _commands():
        cmd = sub.add_parser(
            module.NAME, help=module.HELP, description=module.HELP, formatter_class=HelpFormatter
        )
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``aflowrl`` console script."""
    from aflowrl.cli.exitcodes import ExitCode
    from aflowrl.errors import AflowRLError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return ExitCode.USAGE
    try:
        return int(args._run(args) or 0)
    except AflowRLError as exc:
        known = _exit_code(exc)
        if known is None:
            raise
        code, kind = known
        print(f"aflowrl {args.command}: {kind}: {exc}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        print(f"aflowrl {args.command}: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED


def _exit_code(exc: BaseException) -> tuple[int, str] | None:
    """(exit status, what kind of error) of the errors a command reports in one line; None for
    the others (a bug: its traceback is the report). Imported here, so ``--help`` stays light."""
    from aflowrl.benchmarks.errors import DownloadError
    from aflowrl.cli.exitcodes import ExitCode
    from aflowrl.errors import InvalidInputError, NotFoundError
    from aflowrl.executor.errors import ExecutorError

    if isinstance(exc, (InvalidInputError, NotFoundError)):
        return ExitCode.USAGE, "error"
    if isinstance(exc, ExecutorError):
        return ExitCode.EXECUTOR, "executor error"
    if isinstance(exc, DownloadError):
        return ExitCode.DOWNLOAD, "download error"
    return None


if __name__ == "__main__":
    sys.exit(main())
