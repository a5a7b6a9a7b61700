"""Probabilistic profiling, the Go receiver's `probabilistic_threshold` and `probabilistic_interval`:
every interval a number from 0 to 99 is drawn, and the host is profiled for that interval when the
threshold is above it (threshold 100, the default: always; 10: about one interval in ten). A fleet
of agents so profiles a share of its hosts' time at a share of the cost.

The draw only switches the BPF program's sampling on or off (Sampler.set_profiling): what was
counted is reported as usual, and an off-CPU wait recorded before a pause still ends and counts.
"""

from __future__ import annotations

import random
from typing import Callable

from pycollector.periodic import Periodic

ALWAYS = 100


def _new_rng() -> random.Random:
    """The draws' own generator (tests put a seeded one here)."""
    return random.Random()


class ProbabilisticProfiling:
    def __init__(self, set_profiling: Callable[[bool], None], interval_s: float, threshold: int, log) -> None:
        self.set_profiling = set_profiling
        self.interval_s = interval_s
        self.threshold = threshold
        self.log = log
        self.stats = {"intervals_on": 0, "intervals_off": 0}
        self._rng = _new_rng()
        self._periodic = Periodic("profiling-probabilistic", interval_s, self._draw, log)

    def start(self) -> None:
        self._draw()  # the first interval starts now, as Go's agent does
        self._periodic.start()

    def close(self) -> None:
        self._periodic.close()

    def _draw(self) -> None:
        on = self._rng.randrange(ALWAYS) < self.threshold
        self.stats["intervals_on" if on else "intervals_off"] += 1
        self.set_profiling(on)
        self.log.debug("probabilistic profiling", profiling=on, seconds=self.interval_s, threshold=self.threshold)
