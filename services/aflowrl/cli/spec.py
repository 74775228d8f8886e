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
        "included (-o json: the same document as JSON); validate: check FILE; resolve: print "
        "FILE with every default filled in",
    )
    from aflowrl.cli._help import add_file_argument, add_output_argument

    add_file_argument(parser, "run file (YAML; bare spec or TrainingRun); '-' reads stdin")
    add_output_argument(parser)
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
    import yaml

    from aflowrl import presets
    from aflowrl.cli._io import load_spec, print_document
    from aflowrl.errors import InvalidInputError

    if args.action == "default":
        shipped = presets.text(args.preset or presets.DEFAULT)
        if args.output == "yaml":
            print(shipped, end="")
        else:
            print_document(yaml.safe_load(shipped), args.output)
        return 0
    if args.preset:
        raise InvalidInputError(
            f"'aflowrl spec {args.action}' reads a run file, not a preset", field="--preset"
        )
    if not args.spec:
        raise InvalidInputError(f"'aflowrl spec {args.action}' needs a run file", field="-f/--file")
    spec = load_spec(args.spec)
    if args.action == "validate":
        print(f"{args.spec}: valid", file=sys.stderr)
    else:
        print_document(spec.to_document(), args.output)
    return 0
