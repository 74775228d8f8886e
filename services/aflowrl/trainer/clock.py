"""Where an iteration's wall time goes: phases, and time inside service calls.

A :class:`Timeline` per iteration accumulates the wall time of each phase (``reset``,
``generate``, ``step``, ``advantage``, ``logprob``, ``train``, ``weight_sync``, ``checkpoint``;
phases may overlap with off-policy overlap) and the time during which at least one service call
was in flight (calls run concurrently, so this is the length of the union of their intervals).
The trainer's own overhead is the rest: ``1 - busy / iteration``. Read by the run records, the
progress display and ``bench/throughput.py``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator

from aflowrl.trainer.metrics import PHASES


class Timeline:
    """Phase times and service-call busy time of one iteration (module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._now = clock
        self.started = self._now()
        self.phases: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.busy_s = 0.0
        self._in_flight = 0
        self._busy_since = 0.0
        self.ended: float | None = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the block's wall time to phase ``name``."""
        if name not in self.phases:
            raise ValueError(f"unknown phase {name!r} (one of {', '.join(self.phases)})")
        begun = self._now()
        try:
            yield
        finally:
            self.phases[name] += self._now() - begun

    @contextlib.asynccontextmanager
    async def call(self) -> AsyncIterator[None]:
        """Mark a service call in flight for the duration of the block."""
        if self._in_flight == 0:
            self._busy_since = self._now()
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self.busy_s += self._now() - self._busy_since

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
        busy = self.busy_s
        if self._in_flight:
            busy += self._now() - self._busy_since
        return max(0.0, self.total_s - busy)

    def record(self) -> dict[str, float]:
        """``time/<phase>``, ``time/iteration``, ``time/service_calls``, ``time/overhead_ratio``."""
        total = self.total_s
        out = {f"time/{name}": seconds for name, seconds in self.phases.items()}
        out["time/iteration"] = total
        out["time/service_calls"] = total - self.overhead_s
        out["time/overhead_ratio"] = self.overhead_s / total if total > 0 else 0.0
        return out
