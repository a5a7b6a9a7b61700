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

With ``sending_queue: {storage: <extension>}`` the queue is a PersistentQueue in that storage
extension, opened at ``start(host)``: a request is deleted from it only when its send ended, one
whose retries ran out (max_elapsed_time) goes back to the queue instead of being dropped, and at
shutdown what is left stays stored for the next start rather than being counted as failed.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from pycollector.component import PermanentError, RefusedError, Settings, StartError
from pycollector.exporterhelper.backoff import ExponentialBackoff
from pycollector.exporterhelper.bounded_queue import BoundedQueue
from pycollector.exporterhelper.config import QueueSettings, RetrySettings
from pycollector.exporterhelper.failure_log import FailureLog
from pycollector.exporterhelper.persistent_queue import PersistentQueue
from pycollector.exporterhelper.sizer import Sizer
from pycollector.obsreport import ItemCounters
from pycollector.pdata import item_count, signal_of
from pycollector.pdata.builder import merge as merge_profiles
from pycollector.pdata.serialized import as_message

# How long a stopping exporter keeps sending what its queue holds.
DRAIN_TIMEOUT = 5.0


class RetryableSendError(Exception):
    """The backend did not take the data now; ``retry_after`` is the wait it asked for, if any."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class _GaveUp(Exception):
    """A retryable failure that will not be retried (retries off, time up, shutting down)."""

    def __init__(self, reason: str, error: RetryableSendError, time_up: bool = False):
        super().__init__(f"{reason}: {error}")
        self.retry_after = error.retry_after
        self.time_up = time_up  # max_elapsed_time ran out


_KEPT = object()  # _deliver's answer for a request left in the persistent queue


def merge_requests(parts: list[Any]) -> Any:
    """One message of the same type holding every part's data, in order: profiles re-indexed into
    one dictionary, other signals' resource lists put end to end."""
    if len(parts) == 1:
        return parts[0]
    parts = [as_message(part) for part in parts]
    merged = type(parts[0])()
    merged.CopyFrom(parts[0])
    for part in parts[1:]:
        if signal_of(part) == "profiles":
            merge_profiles(merged, part)
        else:
            merged.MergeFrom(part)
    return merged


class QueuedRetryExporter:
    def __init__(self, settings: Settings, retry: RetrySettings, queue: QueueSettings, send: Callable[[Any], None], signal_name: str = ""):
        """``signal_name`` names the persistent queue's store when an exporter has one queue per signal."""
        self._send = send
        self._signal_name = signal_name
        self._retry = retry
        self._queue_settings = queue
        self._counters = ItemCounters(settings.telemetry, "otelcol_exporter", "the exporter")
        self._failures = FailureLog(settings.logger)
        self._stopping = threading.Event()
        self._workers: list[threading.Thread] = []
        self._name = str(settings.id)
        self._log = settings.logger
        self._queue: BoundedQueue | PersistentQueue | None = None
        self._gathering = threading.Lock()  # sending_queue::batch: one consumer gathers a batch at a time
        self._carried: Any = None  # a request taken that did not fit the last batch (max_size): the next one's first
        self._persistent = queue.enabled and queue.storage is not None
        if queue.enabled:
            sizer = Sizer(queue.sizer)
            self._queue = None if self._persistent else BoundedQueue(queue.queue_size, sizer)
            settings.telemetry.gauge("otelcol_exporter_queue_size", f"Current size of the retry queue (in {queue.sizer}).").set_function(
                lambda: self._queue.used() if self._queue is not None else 0)
            settings.telemetry.gauge("otelcol_exporter_queue_capacity", f"Fixed capacity of the retry queue (in {queue.sizer}).").set(queue.queue_size)
        self._quarantine_counter = settings.telemetry.counter(
            "pycollector_exporter_queue_quarantined_requests", "Requests of the persistent queue that did not decode, kept aside under quarantine/ and never sent.")

    def start(self, host: Any = None) -> None:
        """``host`` finds the storage extension of a persistent queue."""
        if self._persistent and self._queue is None:
            self._queue = self._open_persistent_queue(host)
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
        try:
            accepted = self._queue.put(data) if self._queue_settings.block_on_overflow else self._queue.offer(data)
        except Exception as error:  # the persistent queue's store failed (a full disk): not accepted
            raise self._refused(data, f"the persistent queue could not store it: {error}") from error
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

    def _open_persistent_queue(self, host: Any) -> PersistentQueue:
        where = f"exporters::{self._name}::sending_queue::storage"
        storage_id = self._queue_settings.storage
        extension = host.get_extension(storage_id) if host is not None else None
        if extension is None or not hasattr(extension, "get_client"):
            raise StartError(f"{where}: no storage extension {storage_id!r} in service::extensions")
        try:
            client = extension.get_client("exporter", self._name, self._signal_name)
            queue = PersistentQueue(client, self._queue_settings.queue_size, Sizer(self._queue_settings.sizer), on_quarantine=self._quarantined)
        except Exception as error:  # a corrupt or unwritable store: say which, before taking data
            raise StartError(f"{where}: {error}") from error
        if queue.replayed:
            self._log.info("sending what the persistent queue held when the collector stopped", requests=queue.replayed, storage=storage_id)
        return queue

    def _quarantined(self, key: str, error: Exception) -> None:
        """A stored request that does not decode: kept aside in the store, never sent."""
        self._quarantine_counter.inc()
        self._failures.record("error", "a request in the persistent queue does not decode; kept aside under quarantine/ and not sent", 1,
                              key=key, error=repr(error))

    def _work(self) -> None:
        while (request := self._next_request()) is not None:
            if not self._persistent:
                self._deliver(request)
                continue
            if self._deliver(request.data, keep=True) is _KEPT:
                if not self._stopping.is_set():  # the backend is still down: to the back of the queue
                    self._failures.record("warning", "the backend is still down after max_elapsed_time; the request stays in the persistent queue", item_count(request.data))
                    self._queue.requeue(request)
                continue
            try:
                self._queue.done(request)  # delivered, or dropped and counted
            except Exception as error:  # the store failed: the request will be sent again at start
                self._log.error("could not remove a sent request from the persistent queue", error=str(error))

    def _next_request(self) -> Any:
        """The next request to send: the queue's oldest or, with batching, a batch of them. One
        consumer gathers at a time (Go's one batcher in front of its senders): the others wait
        for the next batch rather than each holding a part of this one."""
        batching = self._queue_settings.batch
        if batching is None:
            return self._queue.take()
        with self._gathering:
            first, self._carried = (self._carried, None) if self._carried is not None else (self._queue.take(), None)
            if first is None:
                return None
            merged, self._carried = self._gather(first, batching)
            return merged

    def _gather(self, first: Any, batching) -> tuple[Any, Any]:
        """``first`` and what else the queue yields within flush_timeout, merged until min_size
        (Go's sending_queue::batch); returns (the merged request, one taken that did not fit)."""
        sizer = Sizer(self._queue_settings.batch_sizer())
        parts, size = [first], sizer.of(first)
        deadline = time.monotonic() + batching.flush_timeout
        while size < batching.min_size and not self._stopping.is_set():
            more = self._queue.take_within(deadline - time.monotonic())
            if more is None:
                break
            more_size = sizer.of(more)
            if type(more) is not type(first) or (batching.max_size and size + more_size > batching.max_size):
                return merge_requests(parts), more
            parts.append(more)
            size += more_size
        return merge_requests(parts), None

    def _deliver(self, data: Any, keep: bool = False) -> Exception | object | None:
        """Send with retries; count the outcome. Returns the error that made it fail, if any, or
        _KEPT when ``keep`` (a persistent queue's request) and the exporter stopped first or the
        backend stayed down past max_elapsed_time: the store keeps it rather than dropping it."""
        try:
            self._send_with_retry(data)
        except _GaveUp as error:
            if keep and (self._stopping.is_set() or error.time_up):
                return _KEPT
            self._dropped(data, str(error))
            return error
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
                    raise _GaveUp("no more retries left (max_elapsed_time)", error, time_up=True) from error
                delay = max(delay, error.retry_after or 0.0)
                self._failures.record("warning", "exporting failed; will retry", item_count(data), error=str(error), interval=round(delay, 3))
                if self._stopping.wait(delay):
                    raise _GaveUp("the exporter is shutting down", error) from error

    def _dropped(self, data: Any, reason: str) -> None:
        count = item_count(data)
        self._counters.add("send_failed", signal_of(data), count)
        self._failures.record("error", "exporting failed; dropping data", count, error=reason)
