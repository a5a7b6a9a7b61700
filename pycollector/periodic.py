"""A task run every few seconds on its own daemon thread, until closed. A tick that raises is
logged and the next one runs: one bad moment must not end the task for the process's life."""

from __future__ import annotations

import threading
from typing import Any, Callable


class Periodic:
    def __init__(self, name: str, interval_s: float, tick: Callable[[], None], logger: Any) -> None:
        self.interval_s = interval_s
        self._tick = tick
        self._log = logger
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    @property
    def stopping(self) -> bool:
        """close() was called: a long tick may end early."""
        return self._stop.is_set()

    def start(self) -> None:
        """The first tick comes one interval from now."""
        self._thread.start()

    def close(self, timeout: float | None = None) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._tick()
            except Exception:  # noqa: BLE001 - logged with its traceback; the next tick runs
                self._log.exception("a periodic task failed; it runs again next interval", task=self._thread.name)
