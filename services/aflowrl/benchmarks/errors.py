"""Errors of the benchmark loaders and scorers."""

from __future__ import annotations

from pathlib import Path

from aflowrl.errors import (
    AflowRLError,
    InvalidInputError,
    NotFoundError,
    PermanentError,
    UnavailableError,
)


class DatasetLineError(InvalidInputError):
    """A line of a split file is malformed; names the file, the line and the field."""

    def __init__(self, path: Path, line: int, message: str, *, field: str | None = None) -> None:
        self.path = path
        self.line = line
        where = f"{path}:{line}: " + (f"field {field!r}: " if field else "")
        super().__init__(where + message)
        self.field = field


class DataNotFoundError(NotFoundError):
    """A split file (or the data directory a benchmark needs) is missing."""


class UnknownBenchmarkError(NotFoundError):
    """No benchmark of that name."""


class DownloadError(AflowRLError):
    """``aflowrl data download`` failed; the message names the file or URL, the cause and the
    fix. The two subclasses say whether trying again can help."""


class DownloadUnavailableError(DownloadError, UnavailableError):
    """No network, a refused connection, a timeout or an HTTP 5xx: try again later."""


class DownloadFailedError(DownloadError, PermanentError):
    """An HTTP 4xx, a checksum mismatch, a broken archive or a disk that cannot take the files:
    the same download would fail the same way."""
