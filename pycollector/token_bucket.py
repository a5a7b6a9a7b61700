"""A rate shared by many: what may be spent per second, saved up for at most a second (or up to
``burst``).

Budgets that hold for the whole agent, not per process (ARCHITECTURE.md, "Trust boundary"): all
perf maps together read so many bytes a second, all processes' long /proc/PID/maps so many; no
number of processes makes that more. Not thread-safe: its owner holds its own lock."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    def __init__(self, per_second: float, clock: Callable[[], float] = time.monotonic, *, burst: float | None = None) -> None:
        self.per_second = per_second
        self.burst = per_second if burst is None else burst
        self._clock = clock
        self._tokens, self._at = float(self.burst), clock()

    def available(self) -> int:
        """What may be spent now (0 when an overspend is still being paid back)."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.per_second)
        self._at = now
        return max(0, int(self._tokens))

    def spend(self, amount: float) -> None:
        """Spent, possibly more than was available: what comes after waits until it is paid."""
        self._tokens -= amount
