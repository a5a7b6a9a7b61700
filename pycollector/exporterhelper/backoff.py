"""Exponential backoff with jitter, as the Go collector's retry sender computes it."""

from __future__ import annotations

import random
import time

from pycollector.exporterhelper.config import RetrySettings


class ExponentialBackoff:
    """The waits between attempts at one request; ``next_delay`` is None when time is up.

    The interval starts at ``initial_interval`` and grows by ``multiplier`` up to ``max_interval``;
    each wait is the interval randomized by ``randomization_factor``. Once the time since the
    first attempt plus the next wait would pass ``max_elapsed_time`` (if not 0), it gives up.
    """

    def __init__(self, settings: RetrySettings, clock=time.monotonic, rng: random.Random | None = None):
        self.settings = settings
        self._clock = clock
        self._rng = rng or random.Random()
        self._started = clock()
        self._interval = settings.initial_interval

    def next_delay(self) -> float | None:
        settings = self.settings
        spread = settings.randomization_factor * self._interval
        delay = self._interval - spread + self._rng.random() * 2 * spread
        self._interval = min(self._interval * settings.multiplier, settings.max_interval)
        elapsed = self._clock() - self._started
        if settings.max_elapsed_time and elapsed + delay > settings.max_elapsed_time:
            return None
        return delay
