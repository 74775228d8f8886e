"""Where an iteration's wall time goes: phases, and time inside service calls.

A :class:`Timeline` per iteration accumulates the wall time of each phase (``reset``,
``generate``, ``step``, ``advantage``, ``logprob``, ``train``, ``weight_sync``, ``checkpoint``)
and the time during which at least one service call was in flight. Both are lengths of unions
of intervals: blocks of one phase may run concurrently (episodes move independently, so one
episode's ``step`` runs while another's ``generate`` and a third's ``step`` do), and a phase's
time is the wall time during which at least one of its blocks was running; calls run
concurrently, so the time in services is the wall time with at least one call in flight. Phases
of different names overlap (``generate`` and ``step`` during collection; the next iteration's
collection and this one's update with off-policy overlap), so their sum may exceed the
iteration's time. The trainer's own overhead is the rest: ``1 - busy / iteration``, the share of
the iteration during which no service call was in flight. Read by the run records, the progress
display and ``bench/throughput.py``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator

from aflowrl.trainer.metrics import PHASES


class _Union:
    """Length of the union of possibly overlapping intervals, opened and closed one by one."""

    def __init__(self) -> None:
        self.total = 0.0
        self.open = 0
        self.since = 0.0

    def enter(self, now: float) -> None:
        if self.open == 0:
            self.since = now
        self.open += 1

    def leave(self, now: float) -> None:
        self.open -= 1
        if self.open == 0:
            self.total += now - self.since

    def length(self, now: float) -> float:
        """The union's length so far (an interval still open counts up to ``now``)."""
        return self.total + (now - self.since if self.open else 0.0)


class Timeline:
    """Phase times and service-call busy time of one iteration (module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._now = clock
        self.started = self._now()
        self._phases = {name: _Union() for name in PHASES}
        self._calls = _Union()
        self.ended: float | None = None

    @property
    def phases(self) -> dict[str, float]:
        """Seconds per phase: the wall time during which at least one of its blocks ran."""
        now = self._now()
        return {name: union.length(now) for name, union in self._phases.items()}

    @property
    def busy_s(self) -> float:
        """Wall time with at least one service call in flight."""
        return self._calls.length(self._now())

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count the block's wall time in phase ``name`` (once where blocks overlap)."""
        union = self._phases.get(name)
        if union is None:
            raise ValueError(f"unknown phase {name!r} (one of {', '.join(self._phases)})")
        union.enter(self._now())
        try:
            yield
        finally:
            union.leave(self._now())

    @contextlib.asynccontextmanager
    async def call(self) -> AsyncIterator[None]:
        """Mark a service call in flight for the duration of the block."""
        self._calls.enter(self._now())
        try:
            yield
        finally:
            self._calls.leave(self._now())

    def finish(self) -> None:
        """Stop the iteration's clock (idempotent)."""
        if self.ended is None:
            self.ended = self._now()

    @property
    def total_s(self) -> float:
        return (self.ended if self.ended is not None else self._now()) - self.started

    @property
    def overhead_s(self) -> float:
        """Wall time with no service call in flight."""
        return max(0.0, self.total_s - self.busy_s)

    def record(self) -> dict[str, float]:
        """``time/<phase>``, ``time/iteration``, ``time/service_calls``, ``time/overhead_ratio``."""
        total = self.total_s
        overhead = self.overhead_s
        out = {f"time/{name}": seconds for name, seconds in self.phases.items()}
        out["time/iteration"] = total
        out["time/service_calls"] = total - overhead
        out["time/overhead_ratio"] = overhead / total if total > 0 else 0.0
        return out
