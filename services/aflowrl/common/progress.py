"""The one way a command draws a progress bar: on a terminal only, on stderr.

``aflowrl eval``, ``optimize``, ``train`` and ``data download`` call :func:`progress_bar`. A bar
redraws itself with ``\\r``; written into a log file or a pod's log those redraws become noise, so
the bar is drawn only when its stream is a terminal (``enabled=None``), never with
``--no-progress`` (``enabled=False``), and then nothing at all is written.
"""

from __future__ import annotations

import sys
from typing import IO, Any


def bar_enabled(enabled: bool | None, stream: IO[str] | None = None) -> bool:
    """Whether to draw: ``enabled`` when given, else whether ``stream`` (stderr) is a terminal."""
    if enabled is not None:
        return enabled
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def progress_bar(
    total: int | None,
    *,
    unit: str,
    enabled: bool | None = None,
    stream: IO[str] | None = None,
    **options: Any,
) -> Any:
    """A tqdm bar on ``stream`` (stderr), disabled unless :func:`bar_enabled`. A disabled bar
    takes every call and writes nothing."""
    from tqdm import tqdm

    stream = stream if stream is not None else sys.stderr
    return tqdm(
        total=total,
        unit=unit,
        file=stream,
        disable=not bar_enabled(enabled, stream),
        dynamic_ncols=True,
        **options,
    )
