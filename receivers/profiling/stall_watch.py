"""Whether the receiver's threads still make progress, told to the health check.

Each thread says what it is doing (`Progress.stage`); a watcher thread checks every few seconds
and, when one has stayed in a stage past its allowance, reports the receiver as
``recoverable_error`` with the thread and stage ("report: symbolizing pid 4242 for 93 s"), and
``ok`` again once it moves. A stalled report thread keeps the kernel counting and the port
answering, so without this a health check would answer 200 to an agent that sends nothing.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from pycollector.periodic import Periodic

CHECK_INTERVAL_S = 2.0


class ReportStalled(RuntimeError):
    """A thread of the profiling receiver has not moved for longer than it may."""


class Progress:
    """What one thread is doing, and since when (monotonic seconds). Cheap enough to call per
    process in a report."""

    def __init__(self, thread: str, allowance_s: float, clock=time.monotonic) -> None:
        self.thread = thread
        self.allowance_s = allowance_s
        self._clock = clock
        self._lock = threading.Lock()
        self._stage = "starting"
        self._since = clock()

    def stage(self, doing: str) -> None:
        with self._lock:
            self._stage, self._since = doing, self._clock()

    def idle(self) -> None:
        """Waiting for its next turn: not a stall, however long."""
        self.stage("")

    def stalled(self) -> str | None:
        """"thread: stage for N s" when it has overstayed, else None."""
        with self._lock:
            stage, age = self._stage, self._clock() - self._since
        if stage and age > self.allowance_s:
            return f"{self.thread}: {stage} for {age:.0f} s"
        return None


class StallWatch:
    def __init__(self, progresses: list[Progress], report_status, source: str, logger: Any) -> None:
        """``report_status(source, status, error)``: the host's (the health check hears it)."""
        self._progresses = progresses
        self._report_status = report_status
        self._source = source
        self.log = logger
        self._stalled: str | None = None
        self._periodic = Periodic("profiling-stall-watch", CHECK_INTERVAL_S, self.check, logger)
        self.stats = {"stalls": 0}

    def start(self) -> None:
        self._periodic.start()

    def close(self) -> None:
        self._periodic.close(CHECK_INTERVAL_S + 1)

    def check(self) -> None:
        stalled = [found for progress in self._progresses if (found := progress.stalled())]
        if stalled and self._stalled is None:
            self._stalled = "; ".join(stalled)
            self.stats["stalls"] += 1
            self.log.error("the profiling receiver is stuck; no profile leaves it until this ends", stuck=self._stalled)
            self._report_status(self._source, "recoverable_error", ReportStalled(f"stuck: {self._stalled}"))
        elif not stalled and self._stalled is not None:
            self.log.info("the profiling receiver moves again", was=self._stalled)
            self._stalled = None
            self._report_status(self._source, "ok", None)
