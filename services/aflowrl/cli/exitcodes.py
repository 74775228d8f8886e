"""The exit statuses of every ``aflowrl`` command, defined once.

:func:`aflowrl.cli.main` maps each error type to one of these; ``docs/reference/exit-codes.md``
documents them for users (a test keeps the two in step). Scripts and Kubernetes read them: a Job
whose trainer exits with :attr:`ExitCode.USAGE` will not succeed on a retry, one that exits with
:attr:`ExitCode.EXECUTOR` may.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Exit status of an ``aflowrl`` command."""

    OK = 0
    """The command did what was asked."""
    FAILURE = 1
    """An unexpected failure while running (the message, or the run's log, says what)."""
    USAGE = 2
    """Bad input, found before any work started: a flag, a run document, a workflow file, a
    data file, a missing benchmark split. Fix the input and run again."""
    EXECUTOR = 3
    """The executor endpoint failed: unreachable, refused the API key, does not serve the
    model, has no chat completions at that URL, or did not answer in time."""
    DOWNLOAD = 4
    """``aflowrl data download`` failed: no network, an HTTP error, a checksum mismatch or a
    full disk."""
    INTERRUPTED = 130
    """Interrupted by Ctrl-C (SIGINT)."""
    TERMINATED = 143
    """Stopped by SIGTERM (``aflowrl train``: its services were stopped first)."""
