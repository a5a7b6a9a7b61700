"""What health_check answers, worked out from the component status events the service reports
(``on_component_status``: starting, ok, recoverable_error, failed, fatal, stopping, stopped).

Healthy means every component that reported is ``ok`` and at least one receiver is: receivers
start last (after exporters and processors), so a running receiver means the pipelines behind it
are up, and before the first one is, nothing is flowing yet.
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any, Callable

from pycollector.config.types import format_duration

OK = "ok"
STARTING = "starting"
ERRORS = frozenset({"recoverable_error", "failed", "fatal"})
RECEIVERS = "receivers::"


class StatusBoard:
    def __init__(self, clock: Callable[[], float] = time.time):
        self._clock = clock
        self._statuses: dict[str, tuple[str, str | None]] = {}
        self._healthy_since: float | None = None
        self._lock = threading.Lock()

    def update(self, source: str, status: str, error: BaseException | None) -> None:
        with self._lock:
            self._statuses[source] = (status, str(error) if error else None)
            if self._reason() is None:
                self._healthy_since = self._healthy_since or self._clock()
            else:
                self._healthy_since = None

    def health(self) -> tuple[bool, dict[str, Any]]:
        """(healthy?, the JSON body to answer with)."""
        with self._lock:
            reason = self._reason()
            if reason is None:
                since = datetime.datetime.fromtimestamp(self._healthy_since, datetime.timezone.utc)
                return True, {
                    "status": "Server available",
                    "upSince": since.isoformat(),
                    "uptime": format_duration(round(self._clock() - self._healthy_since, 3)),
                    "components": {source: status for source, (status, _) in self._statuses.items()},
                }
            components = {source: _entry(status, error) for source, (status, error) in self._statuses.items()}
            return False, {"status": "Server not available", "reason": reason, "components": components}

    def _reason(self) -> str | None:
        """Why the collector is not healthy, naming the components concerned; None if it is."""
        failing = [f"{source} {status}: {error}" for source, (status, error) in self._statuses.items() if status in ERRORS]
        if failing:
            return "; ".join(failing)
        starting = [source for source, (status, _) in self._statuses.items() if status == STARTING]
        if starting:
            return "starting: " + ", ".join(starting)
        stopped = [source for source, (status, _) in self._statuses.items() if status != OK]
        if stopped:
            return "shutting down: " + ", ".join(stopped)
        if not any(source.startswith(RECEIVERS) for source in self._statuses):
            return "no pipeline has started yet"
        return None


def _entry(status: str, error: str | None) -> dict[str, str]:
    return {"status": status, "error": error} if error else {"status": status}
