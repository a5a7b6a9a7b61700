"""Queue and retry around an exporter's ``send``: the asynchronous boundary of a pipeline.

An exporter hands its ``send(data)`` to ``QueuedRetryExporter`` and forwards ``start``,
``consume`` and ``shutdown`` to it. ``send`` delivers one message or raises:

- ``RetryableSendError(retry_after=...)``: the backend may take it later; it is retried with
  exponential backoff, waiting at least ``retry_after`` seconds when the backend said so;
- ``PermanentError`` (or anything else): it never will; the data is dropped.

With the queue enabled, ``consume`` only enqueues and ``num_consumers`` threads send; a full queue
refuses at once (``RefusedError``, counted as enqueue_failed) or, with ``block_on_overflow``,
makes the caller wait. With it disabled, ``consume`` sends on the caller's thread and raises what
finally failed. Sent and failed items are counted when the send ends, so the exporter sets
``reports_sent_items = True`` and the engine does not count at ``consume``.

``shutdown`` interrupts every backoff at once, lets the consumers try each queued request once
more until ``DRAIN_TIMEOUT``, and counts what is left as failed.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from pycollector.component import PermanentError, RefusedError, Settings
from pycollector.exporterhelper.backoff import ExponentialBackoff
from pycollector.exporterhelper.bounded_queue import BoundedQueue
from pycollector.exporterhelper.config import QueueSettings, RetrySettings
from pycollector.exporterhelper.failure_log import FailureLog
from pycollector.obsreport import ItemCounters
from pycollector.pdata import item_count, signal_of

# How long a stopping exporter keeps sending what its queue holds.
DRAIN_TIMEOUT = 5.0


class RetryableSendError(Exception):
    """The backend did not take the data now; ``retry_after`` is the wait it asked for, if any."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class _GaveUp(Exception):
    """A retryable failure that will not be retried (retries off, time up, shutting down)."""

    def __init__(self, reason: str, error: RetryableSendError):
        super().__init__(f"{reason}: {error}")
        self.retry_after = error.retry_after


class QueuedRetryExporter:
    def __init__(self, settings: Settings, retry: RetrySettings, queue: QueueSettings, send: Callable[[Any], None]):
        self._send = send
        self._retry = retry
        self._queue_settings = queue
        self._counters = ItemCounters(settings.telemetry, "otelcol_exporter", "the exporter")
        self._failures = FailureLog(settings.logger)
        self._stopping = threading.Event()
        self._workers: list[threading.Thread] = []
        self._name = str(settings.id)
        self._queue: BoundedQueue | None = None
        if self._queue_settings.enabled:
            queue = self._queue = BoundedQueue(self._queue_settings.queue_size)
            settings.telemetry.gauge("otelcol_exporter_queue_size", "Current size of the retry queue (in batches).").set_function(lambda: len(queue))
            settings.telemetry.gauge("otelcol_exporter_queue_capacity", "Fixed capacity of the retry queue (in batches).").set(queue.capacity)

    def start(self) -> None:
        if self._queue is None or self._workers:
            return
        for index in range(self._queue_settings.num_consumers):
            worker = threading.Thread(target=self._work, name=f"{self._name} sender {index}", daemon=True)
            worker.start()
            self._workers.append(worker)

    def consume(self, data: Any) -> None:
        if self._stopping.is_set():
            raise self._refused(data, "the exporter is shutting down")
        if self._queue is None:
            error = self._deliver(data)
            if isinstance(error, _GaveUp):
                raise RefusedError(str(error), retry_after=error.retry_after)
            if error is not None:
                raise PermanentError(str(error))
            return
        accepted = self._queue.put(data) if self._queue_settings.block_on_overflow else self._queue.offer(data)
        if not accepted:
            raise self._refused(data, "the exporter is shutting down" if self._stopping.is_set() else "the sending queue is full")

    def shutdown(self) -> None:
        """Safe before start and twice: the second call finds nothing left to do."""
        self._stopping.set()
        if self._queue is not None:
            self._queue.close()
            deadline = time.monotonic() + DRAIN_TIMEOUT
            for worker in self._workers:
                worker.join(max(0.0, deadline - time.monotonic()))
            for data in self._queue.take_all():
                self._dropped(data, "the exporter stopped before the queue drained")
        self._failures.flush()

    # -- inside ------------------------------------------------------------------------------

    def _refused(self, data: Any, reason: str) -> RefusedError:
        """Count and log a request the queue did not take; the caller raises what this returns."""
        count = item_count(data)
        self._counters.add("enqueue_failed", signal_of(data), count)
        self._failures.record("error", "data not enqueued; refused to the caller", count, reason=reason)
        return RefusedError(reason)

    def _work(self) -> None:
        while (data := self._queue.take()) is not None:
            self._deliver(data)

    def _deliver(self, data: Any) -> Exception | None:
        """Send with retries; count the outcome. Returns the error that made it fail, if any."""
        try:
            self._send_with_retry(data)
        except Exception as error:  # any failure of a send drops the data; the log says why
            self._dropped(data, str(error))
            return error
        self._counters.add("sent", signal_of(data), item_count(data))
        return None

    def _send_with_retry(self, data: Any) -> None:
        backoff = ExponentialBackoff(self._retry)
        while True:
            try:
                self._send(data)
                return
            except RetryableSendError as error:
                if not self._retry.enabled:
                    raise _GaveUp("retry_on_failure is disabled", error) from error
                delay = backoff.next_delay()
                if delay is None:
                    raise _GaveUp("no more retries left (max_elapsed_time)", error) from error
                delay = max(delay, error.retry_after or 0.0)
                self._failures.record("warning", "exporting failed; will retry", item_count(data), error=str(error), interval=round(delay, 3))
                if self._stopping.wait(delay):
                    raise _GaveUp("the exporter is shutting down", error) from error

    def _dropped(self, data: Any, reason: str) -> None:
        count = item_count(data)
        self._counters.add("send_failed", signal_of(data), count)
        self._failures.record("error", "exporting failed; dropping data", count, error=reason)
