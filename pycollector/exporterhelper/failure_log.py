"""Logging of repeated failures: at most one line per kind of failure per interval, with counts.

A backend that is down fails every request; a line per request (or per item) would bury the log.
The first failure of a kind is logged at once; later ones are added up and reported with the next
line after the interval, or by ``flush`` when the exporter stops.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

DEFAULT_LOG_INTERVAL = 10.0


@dataclasses.dataclass
class _Tally:
    requests: int = 0
    items: int = 0
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    last_logged: float = float("-inf")


class FailureLog:
    def __init__(self, logger: Any, interval: float = DEFAULT_LOG_INTERVAL, clock=time.monotonic):
        self.logger = logger
        self.interval = interval
        self._clock = clock
        self._tallies: dict[tuple[str, str], _Tally] = {}
        self._lock = threading.Lock()

    def record(self, level: str, event: str, items: int, **fields: Any) -> None:
        """One failed request of ``items`` items; ``fields`` (the latest error...) go in the line."""
        with self._lock:
            tally = self._tallies.setdefault((level, event), _Tally())
            tally.requests += 1
            tally.items += items
            tally.fields = fields
            now = self._clock()
            if now - tally.last_logged < self.interval:
                return
            tally.last_logged = now
            line = self._take(tally)
        getattr(self.logger, level)(event, **line)

    def flush(self) -> None:
        """Log what was added up since each kind's last line."""
        with self._lock:
            lines = [(level, event, self._take(tally)) for (level, event), tally in self._tallies.items() if tally.requests]
        for level, event, line in lines:
            getattr(self.logger, level)(event, **line)

    @staticmethod
    def _take(tally: _Tally) -> dict[str, Any]:
        line = {"requests": tally.requests, "items": tally.items, **tally.fields}
        tally.requests = tally.items = 0
        return line
