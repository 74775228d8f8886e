"""``aflowrl spec``: show the default run spec, or validate a run file."""

from __future__ import annotations

import argparse
import sys

NAME = "spec"
HELP = "Print the default RunSpec, or validate a run file (bare spec or TrainingRun)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=["default", "validate", "resolve"],
        help="default: print the embedded default spec; validate: check FILE; "
        "resolve: print FILE with every default filled in",
    )
    from aflowrl.cli._help import add_file_argument, add_output_argument

    add_file_argument(parser, "run file (YAML; bare spec or TrainingRun); '-' reads stdin")
    add_output_argument(parser)


def run(args: argparse.Namespace) -> int:
    from aflowrl.cli._io import load_spec, print_document
    from aflowrl.errors import InvalidInputError

    if args.action == "default":
        print_document(load_spec(None).to_document(), args.output)
        return 0
    if not args.spec:
        raise InvalidInputError(f"'aflowrl spec {args.action}' needs a run file", field="-f/--file")
    spec = load_spec(args.spec)
    if args.action == "validate":
        print(f"{args.spec}: valid", file=sys.stderr)
    else:
        print_document(spec.to_document(), args.output)
    return 0
