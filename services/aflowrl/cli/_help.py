"""The help formatter of every ``aflowrl`` command: each option's default is shown.

Used by :func:`aflowrl.cli.build_parser` for every command and by commands for their own
sub-commands. Argparse's ``ArgumentDefaultsHelpFormatter`` also prints "(default: None)" and
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
