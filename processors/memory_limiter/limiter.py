"""The memory limiter: refuses data while the process holds too much memory.

As in Go: a thread measures memory every ``check_interval``. From a check at or above the soft
limit (limit - spike) until a check below it, ``consume`` raises RefusedError, which the receiver
turns into backpressure (gRPC UNAVAILABLE, HTTP 503, the profiling receiver keeps its counts in the
kernel). Entering the soft limit forces a garbage collection (at most every
``min_gc_interval_when_soft_limited``); every check at or above the hard limit forces one too (at
most every ``min_gc_interval_when_hard_limited``). Each change of state is logged once.

Python-specific: memory is the resident set size, and above the soft limit each check first
returns freed heap pages to the kernel (cheap, no collection), so memory that downstream has let
go of shows at once and refusing stops as soon as it can.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable

from pycollector.component import Component, Consumer, RefusedError
from pycollector.config.types import format_duration
from pycollector.pdata import item_count, signal_of

from processors.item_counters import item_counters
from processors.memory_limiter import memory
from processors.memory_limiter.config import (
    DEFAULT_SPIKE_SHARE,
    FALLBACK_LIMIT_PERCENTAGE,
    MemoryLimiterConfig,
)

MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Limits:
    hard: int  # bytes
    spike: int

    @property
    def soft(self) -> int:
        return self.hard - self.spike


def limits_for(config: MemoryLimiterConfig, available_bytes: Callable[[], int], workers: int = 1) -> Limits:
    """``limit_mib`` wins over ``limit_percentage``; a spike of 0 means 20% of the limit. The
    limits are the collector's: each of ``workers`` processes, which check their own memory,
    gets an equal share (the container's limit is on all of them together)."""
    if config.limit_mib:
        hard, spike = config.limit_mib * MIB, config.spike_limit_mib * MIB
    else:
        available = available_bytes()
        hard = (config.limit_percentage or FALLBACK_LIMIT_PERCENTAGE) * available // 100
        spike = config.spike_limit_percentage * available // 100
    spike = spike or int(hard * DEFAULT_SPIKE_SHARE)
    return Limits(hard // workers, spike // workers)


class MemoryLimiter(Component):
    def __init__(self, settings, config: MemoryLimiterConfig, next_consumer: Consumer, limits: Limits):
        self._log = settings.logger
        self._config = config
        self._next = next_consumer
        self.limits = limits
        self._workers = settings.worker.count
        self.refusing = False
        self._above_hard = False
        self._last_gc = float("-inf")
        self._gc_interval: dict[str, float] = {}  # per state (soft, hard): the current back-off
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._accepted = item_counters(settings.telemetry, "accepted", "the memory limiter passed on")
        self._refused = item_counters(settings.telemetry, "refused", "the memory limiter refused")
        self._used = settings.telemetry.gauge(
            "otelcol_processor_memory_limiter_memory_used_bytes",
            "Resident memory of the process at the memory limiter's last check",
        )
        self._refusing_gauge = settings.telemetry.gauge(
            "otelcol_processor_memory_limiter_refusing",
            "1 while the memory limiter refuses data, else 0",
        )

    def start(self, host) -> None:
        if not (self._config.limit_mib or self._config.limit_percentage):
            self._log.warning(
                "neither limit_mib nor limit_percentage is set; limiting to a share of available memory",
                limit_percentage=FALLBACK_LIMIT_PERCENTAGE,
            )
        self._log.info(
            "memory limiter configured",
            **({"worker_share_of": self._workers} if self._workers > 1 else {}),
            limit_mib=self.limits.hard // MIB,
            spike_limit_mib=self.limits.spike // MIB,
            check_interval=format_duration(self._config.check_interval),
        )
        self._thread = threading.Thread(target=self._monitor, name="memory-limiter", daemon=True)
        self._thread.start()

    def consume(self, data: Any) -> None:
        signal, items = signal_of(data), item_count(data)
        if self.refusing:
            self._refused[signal].inc(items)
            raise RefusedError(
                "data refused due to high memory usage", retry_after=self._config.check_interval
            )
        self._accepted[signal].inc(items)
        self._next.consume(data)

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _monitor(self) -> None:
        self.check()
        while not self._stop.wait(self._config.check_interval):
            self.check()

    def check(self) -> None:
        """One measurement and what follows from it (Go's ``CheckMemLimits``)."""
        used = memory.resident_bytes()
        if used >= self.limits.soft:
            memory.trim_heap()
            used = memory.resident_bytes()
        above_hard = used >= self.limits.hard
        if above_hard:
            if not self._above_hard:
                self._log.warning(
                    "memory usage is above the hard limit; forcing garbage collection",
                    used_mib=used // MIB,
                )
            used = self._collect_garbage(used, "hard", self.limits.hard)
        else:
            self._gc_interval.pop("hard", None)  # (under the limit: the back-off starts over)
        self._above_hard = above_hard
        refusing = used >= self.limits.soft
        if refusing and not self.refusing:
            used = self._collect_garbage(used, "soft", self.limits.soft)
            refusing = used >= self.limits.soft
            if refusing:
                self._log.warning("memory usage is above the soft limit; refusing data", used_mib=used // MIB)
        elif self.refusing and not refusing:
            self._log.info("memory usage back within limits; accepting data again", used_mib=used // MIB)
        if not refusing:
            self._gc_interval.pop("soft", None)
        self.refusing = refusing
        self._used.set(used)
        self._refusing_gauge.set(1 if refusing else 0)

    def _collect_garbage(self, used: int, kind: str, limit: int) -> int:
        """Collect unless the last collection is more recent than this state's interval; memory
        after. A collection that leaves memory at or above ``limit`` doubles the interval (up to
        its max), one that brings it under resets it (see config.py)."""
        low = getattr(self._config, f"min_gc_interval_when_{kind}_limited")
        high = getattr(self._config, f"max_gc_interval_when_{kind}_limited")
        interval = self._gc_interval.get(kind, low)
        if time.monotonic() - self._last_gc < interval:
            return used
        memory.collect_garbage()
        self._last_gc = time.monotonic()
        after = memory.resident_bytes()
        if high and after >= limit:
            self._gc_interval[kind] = min(high, max(low, interval * 2, self._config.check_interval))
        else:
            self._gc_interval[kind] = low
        return after
