"""What the batch processor reports: why each batch went out, how big it was, what was lost.

Names are the Go batch processor's (``otelcol_processor_batch_batch_send_size``, ...). A batch
that downstream would not take is dropped, counted in ``otelcol_processor_dropped_<items>`` and
logged at most once per ``FAILURE_LOG_INTERVAL`` with the number of failures since the last line.
"""

from __future__ import annotations

import threading
import time

from pycollector.telemetry import ComponentTelemetry

from processors.item_counters import item_counters

# The Go processor's histogram buckets, so dashboards built for it read ours the same way.
SEND_SIZE_BUCKETS = (
    10, 25, 50, 75, 100, 250, 500, 750, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000,
    10000, 20000, 30000, 50000, 100000,
)
FAILURE_LOG_INTERVAL = 10.0  # seconds

SIZE_TRIGGER = "size"
TIMEOUT_TRIGGER = "timeout"


class BatchTelemetry:
    def __init__(self, telemetry: ComponentTelemetry, logger) -> None:
        self._send_size = telemetry.histogram(
            "otelcol_processor_batch_batch_send_size", "Number of units in the batch", buckets=SEND_SIZE_BUCKETS
        )
        self._triggers = {
            SIZE_TRIGGER: telemetry.counter(
                "otelcol_processor_batch_batch_size_trigger_send",
                "Number of times the batch was sent due to a size trigger",
            ),
            TIMEOUT_TRIGGER: telemetry.counter(
                "otelcol_processor_batch_timeout_trigger_send",
                "Number of times the batch was sent due to a timeout trigger",
            ),
        }
        self._cardinality = telemetry.gauge(
            "otelcol_processor_batch_metadata_cardinality",
            "Number of distinct metadata value combinations being processed",
        )
        self._cardinality.set(1)  # Go's value for the single batcher, before anything arrives
        self._dropped = item_counters(
            telemetry, "dropped", "the batch processor dropped because downstream failed"
        )
        self._log = logger
        self._lock = threading.Lock()
        self._failures_unlogged = 0
        self._next_log = 0.0

    def batchers(self, count: int) -> None:
        """How many (signal, metadata values) batches are held."""
        self._cardinality.set(max(1, count))

    def sent(self, trigger: str, items: int) -> None:
        self._triggers[trigger].inc()
        self._send_size.observe(items)

    def dropped(self, signal: str, items: int, error: BaseException) -> None:
        self._dropped[signal].inc(items)
        with self._lock:
            self._failures_unlogged += 1
            now = time.monotonic()
            if now < self._next_log:
                return
            self._next_log = now + FAILURE_LOG_INTERVAL
            failures, self._failures_unlogged = self._failures_unlogged, 0
        self._log.warning(
            "sender failed; batch dropped",
            signal=signal,
            items=items,
            error=str(error) or type(error).__name__,
            failures_since_last_report=failures,
        )
