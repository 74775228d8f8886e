"""``aflowrl spec``: show the default run spec, or validate a run file."""

from __future__ import annotations

import argparse
import sys

NAME = "spec"
HELP = (
    "Print the default run (what 'aflowrl train' runs without -f) or a named preset, or "
    "validate a run file (bare spec or TrainingRun)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=["default", "validate", "resolve"],
        help="default: print the embedded default run (or --preset NAME) as shipped, comments "
        "included; validate: check FILE; resolve: print FILE with every default filled in",
    )
    parser.add_argument("-f", "--file", help="run file (YAML); '-' reads stdin")
    add_preset_argument(parser)


def add_preset_argument(parser: argparse.ArgumentParser) -> None:
    """``--preset NAME``, shared by ``spec default`` and ``train`` (names checked when used, so
    ``--help`` imports nothing heavy)."""
    parser.add_argument(
        "--preset",
        help="a named run shipped with aflow-rl: default (the embedded default run), tiny-cpu, "
        "qwen2.5-7b-gsm8k-8gpu... (the examples in manifests/examples); an unknown name lists them",
    )


def run(args: argparse.Namespace) -> int:
    from aflowrl import presets
    from aflowrl.cli._io import dump_yaml, load_spec
    from aflowrl.errors import InvalidInputError

    if args.action == "default":
        print(presets.text(args.preset or presets.DEFAULT), end="")
        return 0
    if args.preset:
        raise InvalidInputError(
            f"'aflowrl spec {args.action}' reads a run file, not a preset", field="--preset"
        )
    if not args.file:
        raise InvalidInputError(f"'aflowrl spec {args.action}' needs a run file", field="-f/--file")
    spec = load_spec(args.file)
    if args.action == "validate":
        print(f"{args.file}: valid", file=sys.stderr)
    else:
        print(dump_yaml(spec.to_document()), end="")
    return 0
