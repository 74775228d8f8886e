"""Conventions of every ``aflowrl`` command's arguments: the help formatter (each option's
default shown), ``-f/--file`` for a run document and ``-o/--output`` for a printed document.

Light (argparse only), so ``add_arguments`` can use it and ``--help`` stays instant. The
formatter is used by :func:`aflowrl.cli.build_parser` for every command and by commands for their
own sub-commands. Argparse's ``ArgumentDefaultsHelpFormatter`` also prints "(default: None)" and
"(default: False)"; this one shows a default only when it is a value, and not when the help text
already says it.
"""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to an option's help when X is a value the help does not state."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text.lower()
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or not action.option_strings
        ):
            return action.help
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def add_file_argument(parser: argparse.ArgumentParser, help: str) -> None:
    """``-f/--file FILE`` (dest ``spec``), the run document of every command that takes one;
    ``--spec``, its old spelling, still works but is not shown."""
    parser.add_argument("-f", "--file", dest="spec", metavar="FILE", help=help)
    parser.add_argument("--spec", dest="spec", metavar="FILE", help=argparse.SUPPRESS)


def add_output_argument(parser: argparse.ArgumentParser) -> None:
    """``-o/--output yaml|json``, for every command that prints a document."""
    parser.add_argument(
        "-o", "--output", choices=["yaml", "json"], default="yaml", help="document format"
    )
