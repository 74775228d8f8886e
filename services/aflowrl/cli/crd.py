"""``aflowrl crd``: print the TrainingRun CustomResourceDefinition generated from RunSpec."""

from __future__ import annotations

import argparse

NAME = "crd"
HELP = "Print the TrainingRun CRD (aflowrl.io/v1alpha1) generated from the RunSpec model."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from aflowrl.cli._help import add_output_argument

    add_output_argument(parser)


def run(args: argparse.Namespace) -> int:
    from aflowrl.cli._io import print_document
    from aflowrl.config.crd import training_run_crd

    print_document(training_run_crd(), args.output)
    return 0
