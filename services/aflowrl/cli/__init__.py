"""The ``aflowrl`` command line.

Each command lives in its own module of this package, exposing ``NAME``, ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``. Modules import only argparse-level things at
import time, so ``aflowrl --help`` stays instant; heavy imports (torch, grpc servers) happen inside
``run``. Bad input exits with status 2 and a message naming the problem.
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
    "plot",
    "show",
)
"""Modules of ``aflowrl.cli`` that define commands, in ``--help`` order."""


def _commands() -> list[ModuleType]:
    return [importlib.import_module(f"aflowrl.cli.{name}") for name in COMMAND_MODULES]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aflowrl",
        description="Train LLMs with RL (GiGPO) to design agentic workflows.",
    )
    parser.add_argument("--version", action="version", version=f"aflow-rl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _commands():
        cmd = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``aflowrl`` console script."""
    from aflowrl.errors import InvalidInputError, NotFoundError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except (InvalidInputError, NotFoundError) as exc:
        print(f"aflowrl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"aflowrl {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
