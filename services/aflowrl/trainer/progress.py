"""The live progress display of a training run.

A tqdm bar over iterations. Its description follows the iteration's phases as they happen
(``it 3 · step 2/4``); after each iteration its postfix shows the mean episode return, the best
validation score so far, the valid-action ratio and the seconds spent in each phase. When the
output is not a terminal (a pod's log, a pipe) the bar is off and each iteration is one log line
instead. Used by :mod:`aflowrl.trainer.loop`.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Mapping
from typing import IO, Any

logger = logging.getLogger(__name__)

_PHASE_LABELS = (
    ("reset", "reset"),
    ("generate", "gen"),
    ("step", "env"),
    ("logprob", "logp"),
    ("train", "train"),
    ("weight_sync", "sync"),
    ("checkpoint", "ckpt"),
)


def _number(value: Any, fmt: str) -> str:
    if isinstance(value, int | float) and math.isfinite(float(value)):
        return format(value, fmt)
    return "-"


def summary_line(record: Mapping[str, Any]) -> str:
    """``return +0.031  best 0.812  valid 100%  | gen 1.2s env 8.1s ...`` of one record."""
    valid = record.get("charts/valid_action_ratio")
    valid_text = f"{100 * valid:.0f}%" if isinstance(valid, int | float) else "-"
    parts = [
        f"return {_number(record.get('charts/episode_return'), '+.3f')}",
        f"best {_number(record.get('charts/best_score'), '.3f')}",
        f"valid {valid_text}",
    ]
    phases = [
        f"{label} {record[f'time/{name}']:.1f}s"
        for name, label in _PHASE_LABELS
        if isinstance(record.get(f"time/{name}"), int | float) and record[f"time/{name}"] >= 0.05
    ]
    return "  ".join(parts) + ("  | " + " ".join(phases) if phases else "")


class Progress:
    """Bar over iterations (module docstring); ``close`` it (or use ``with``)."""

    def __init__(
        self,
        total: int,
        *,
        initial: int = 0,
        enabled: bool | None = None,
        stream: IO[str] | None = None,
        echo: bool = False,
    ) -> None:
        from aflowrl.common.progress import bar_enabled, progress_bar

        stream = stream if stream is not None else sys.stderr
        self.enabled = bar_enabled(enabled, stream)
        # Without a bar, also print each line to ``stream`` (a local run logs to a file only).
        self._echo = stream if echo and not self.enabled else None
        self.total = total
        self._bar: Any = None
        if self.enabled:
            self._bar = progress_bar(
                total,
                unit="it",
                enabled=True,
                stream=stream,
                initial=initial,
                desc="training",
                bar_format="{desc} {bar:16} {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}",
            )

    def start_at(self, iteration: int) -> None:
        """Iterations already done (a resumed run)."""
        if self._bar is not None and iteration != self._bar.n:
            self._bar.reset(total=self.total)
            self._bar.update(iteration)

    def phase(self, iteration: int, text: str) -> None:
        """Show what iteration ``iteration`` is doing now."""
        if self._bar is not None:
            self._bar.set_description_str(f"it {iteration + 1} · {text}", refresh=True)

    def iteration_done(self, record: Mapping[str, Any]) -> None:
        """Advance by one iteration and show its numbers."""
        line = summary_line(record)
        if self._bar is not None:
            self._bar.set_description_str("training", refresh=False)
            self._bar.set_postfix_str(line, refresh=False)
            self._bar.update(1)
        done = f"iteration {int(record['iteration']) + 1}/{self.total}: {line}"
        logger.info("%s", done)
        self._print(done)

    def write(self, text: str) -> None:
        """Print a line above the bar (or to the log when there is none)."""
        if self._bar is not None:
            self._bar.write(text)
        else:
            logger.info("%s", text)
            self._print(text)

    def _print(self, text: str) -> None:
        if self._echo is not None:
            print(text, file=self._echo, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
