"""The batch processor: many small messages in, fewer and larger ones out.

As in Go: a batch goes out as soon as it holds ``send_batch_size`` items, cut into batches of at
most ``send_batch_max_size``; what is left goes out ``timeout`` after the previous send; shutdown
sends everything still held. With ``timeout: 0`` or ``send_batch_size: 0`` every message goes out
at once (still cut to ``send_batch_max_size``). Each signal is batched on its own.

Threads: ``consume`` runs on the caller's thread and sends the batches it fills, so a RefusedError
from downstream reaches the caller and its receiver applies backpressure. Then the caller's own
items are refused (it sends them again) while items accepted from earlier callers stay held for
the next send; if an earlier cut of the same call already sent some of the caller's items, its
retry repeats them (at-least-once). A timer thread sends the batches that time out; nobody waits
on those, so a failure there drops the batch, counted and logged, as the Go processor does
(retrying is the exporter queue's job).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from pycollector.component import Component, Consumer, PermanentError, RefusedError
from pycollector.logs import log_once
from pycollector.pdata import item_count, signal_of

from processors.batch.config import BatchConfig
from processors.batch.pending import Pending
from processors.batch.telemetry import SIZE_TRIGGER, TIMEOUT_TRIGGER, BatchTelemetry


class BatchProcessor(Component):
    def __init__(self, settings, config: BatchConfig, next_consumer: Consumer):
        self._log = settings.logger
        self._where = (settings.kind, str(settings.id))
        self._config = config
        self._next = next_consumer
        self._telemetry = BatchTelemetry(settings.telemetry, settings.logger)
        self._pending: dict[str, Pending] = {}
        self._deadlines: dict[str, float] = {}  # per signal: when its batch times out
        self._changed = threading.Condition()
        self._timer: threading.Thread | None = None
        self._batching = False  # False before start, after shutdown, and when nothing is timed

    def start(self, host) -> None:
        if self._config.metadata_keys:
            log_once(
                self._log,
                (*self._where, "metadata_keys"),
                "warning",
                "batching by metadata is not implemented; one batcher serves all data",
                setting="metadata_keys",
            )
        if self._config.timeout > 0 and self._config.send_batch_size > 0:
            self._batching = True
            self._timer = threading.Thread(
                target=self._send_timed_out, name="batch-timer", daemon=True
            )
            self._timer.start()

    def consume(self, data: Any) -> None:
        if item_count(data) == 0:
            return  # nothing to batch, as in Go
        with self._changed:
            pending = self._pending_for(signal_of(data))
            accepted_before = pending.count
            try:
                pending.add(data)
            except ValueError as error:
                raise PermanentError(str(error)) from error
            sent = 0
            while self._due(pending):
                try:
                    sent += self._send_front(pending, SIZE_TRIGGER, refusals_to_caller=True)
                except RefusedError:
                    pending.keep_front(max(0, accepted_before - sent))
                    raise

    def shutdown(self) -> None:
        with self._changed:
            self._batching = False
            self._changed.notify_all()
        if self._timer is not None:
            self._timer.join()
            self._timer = None
        with self._changed:
            for pending in self._pending.values():
                while pending.count:
                    self._send_front(pending, TIMEOUT_TRIGGER, refusals_to_caller=False)

    # -- helpers, called with self._changed held ------------------------------------------------

    def _pending_for(self, signal: str) -> Pending:
        pending = self._pending.get(signal)
        if pending is None:
            pending = self._pending[signal] = Pending(signal)
            self._deadlines[signal] = time.monotonic() + self._config.timeout
        return pending

    def _due(self, pending: Pending) -> bool:
        """Send now: the batch is full, or nothing is batching and all goes out at once."""
        if not self._batching:
            return pending.count > 0
        return pending.count >= self._config.send_batch_size

    def _send_front(self, pending: Pending, trigger: str, refusals_to_caller: bool) -> int:
        """Send one batch off the front of ``pending``; returns how many items left it."""
        size = min(pending.count, self._config.send_batch_max_size or pending.count)
        batch, rest = pending.cut(size)
        try:
            self._next.consume(batch)
        except Exception as error:  # any downstream failure; the timer thread must survive it
            if refusals_to_caller and isinstance(error, RefusedError):
                raise
            self._telemetry.dropped(pending.signal, size, error)
        else:
            self._telemetry.sent(trigger, size)
        pending.keep(rest, pending.count - size)
        self._deadlines[pending.signal] = time.monotonic() + self._config.timeout
        return size

    def _send_timed_out(self) -> None:
        """The timer thread: sends each signal's batch ``timeout`` after its previous send."""
        with self._changed:
            while self._batching:
                now = time.monotonic()
                for signal, deadline in self._deadlines.items():
                    if deadline <= now:
                        pending = self._pending[signal]
                        while pending.count:
                            self._send_front(pending, TIMEOUT_TRIGGER, refusals_to_caller=False)
                        self._deadlines[signal] = now + self._config.timeout
                next_deadline = min(self._deadlines.values(), default=now + self._config.timeout)
                self._changed.wait(max(0.0, next_deadline - time.monotonic()))
