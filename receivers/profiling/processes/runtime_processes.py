"""The processes one language runtime's walker knows (v8/, hotspot/): each found once per program
(again after an exec), its entry in the kernel's table written, dropped when it exits or runs
another program. What a report may be reading of a dropped process (its memory) is closed only
when the next report starts.

Threading: ``register`` and ``forget`` come from the sampler's and the report's threads; one
registration at a time, so the kernel's entry ends up as the bookkeeping says."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from .proc import ProcessInfo, same_incarnation


class _Known(Protocol):
    info: ProcessInfo


P = TypeVar("P", bound=_Known)


class RuntimeProcesses(Generic[P]):
    def __init__(self, table: Any, find: Callable[[ProcessInfo], P | None], leaf: Callable[[P], Any],
                 close: Callable[[P], None]) -> None:
        """``table``: the kernel's map (tgid -> ``leaf(process)``); ``find(info)``: the runtime's
        state for a process, or None when it does not run that runtime; ``close(process)``: let
        go of what it holds."""
        self._table, self._find, self._leaf, self._close = table, find, leaf, close
        self._lock = threading.Lock()
        self._registering = threading.Lock()
        self._processes: dict[int, P] = {}
        self._retired: list[P] = []

    def register(self, info: ProcessInfo) -> P | None:
        """Look for the runtime in ``info`` (again after its maps changed); the process's state."""
        if info.kernel_thread or info.exited:
            return None
        with self._registering:
            with self._lock:
                before = self._processes.get(info.pid)
            if before is not None and before.info.program == info.program:
                before.info = info  # the same program mapped more (JIT code): nothing to find again
                return before
            found = self._find(info)
            with self._lock:
                before = self._processes.pop(info.pid, None)
                if found is not None:
                    self._processes[info.pid] = found
                if before is not None:
                    self._retired.append(before)
            if found is not None:
                self._table[self._table.Key(info.pid)] = self._leaf(found)
            elif before is not None:
                self._table.pop(self._table.Key(info.pid), None)
            return found

    def forget(self, tgid: int) -> None:
        with self._registering:
            with self._lock:
                process = self._processes.pop(tgid, None)
                if process is not None:
                    self._retired.append(process)
            if process is not None:
                self._table.pop(self._table.Key(tgid), None)

    def get(self, tgid: int, started: int | None = None) -> P | None:
        """tgid's state; None when none is known, or it is of another process than the one that
        started at tick ``started`` (a pid reused)."""
        with self._lock:
            process = self._processes.get(tgid)
        return process if process is not None and same_incarnation(process.info, started) else None

    def known(self) -> list[P]:
        """The processes registered now."""
        with self._lock:
            return list(self._processes.values())

    def new_report(self) -> list[P]:
        """Close what the processes dropped since the last report held; the processes known."""
        with self._lock:
            retired, self._retired = self._retired, []
            known = list(self._processes.values())
        for process in retired:
            self._close(process)
        return known

    def __len__(self) -> int:
        with self._lock:
            return len(self._processes)
