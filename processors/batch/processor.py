"""The batch processor: many small messages in, fewer and larger ones out.

As in Go: a batch goes out as soon as it holds ``send_batch_size`` items, cut into batches of at
most ``send_batch_max_size``; what is left goes out ``timeout`` after the previous send; shutdown
sends everything still held. With ``timeout: 0`` or ``send_batch_size: 0`` every message goes out
at once (still cut to ``send_batch_max_size``). Each signal is batched on its own, and with
``metadata_keys`` each distinct combination of those keys' values in the sender's request metadata
(``pycollector.client``) is batched on its own too, up to ``metadata_cardinality_limit``
combinations; a batch goes downstream with only that metadata as its client, as Go's does.

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

import pycollector.client
from pycollector.component import Component, Consumer, PermanentError, RefusedError
from pycollector.logs import log_once
from pycollector.pdata import item_count, signal_of

from processors.batch.config import BatchConfig
from processors.batch.pending import Pending, SerializedPending, pending_for
from processors.batch.telemetry import SIZE_TRIGGER, TIMEOUT_TRIGGER, BatchTelemetry


# (lower-cased metadata key, its values) for each of metadata_keys, in their order.
Metadata = tuple[tuple[str, tuple[str, ...]], ...]
BatchKey = tuple[str, Metadata]  # (signal, metadata)


class BatchProcessor(Component):
    def __init__(self, settings, config: BatchConfig, next_consumer: Consumer):
        self._log = settings.logger
        self._where = (settings.kind, str(settings.id))
        self._config = config
        self._next = next_consumer
        self._telemetry = BatchTelemetry(settings.telemetry, settings.logger)
        self._pending: dict[BatchKey, Pending | SerializedPending] = {}
        self._deadlines: dict[BatchKey, float] = {}  # per batch: when it times out (none while it is empty)
        self._ticks: dict[BatchKey, float] = {}  # per batch: its timer's last tick (a send, or a timeout)
        self._changed = threading.Condition()
        self._timer: threading.Thread | None = None
        self._batching = False  # False before start, after shutdown, and when nothing is timed

    def start(self, host) -> None:
        if self._config.timeout > 0 and self._config.send_batch_size > 0:
            self._batching = True
            for key, pending in self._pending.items():  # (what a refusal before start kept)
                if pending.count:
                    self._deadlines[key] = self._next_tick(key)
            self._timer = threading.Thread(
                target=self._send_timed_out, name="batch-timer", daemon=True
            )
            self._timer.start()

    def consume(self, data: Any) -> None:
        if item_count(data) == 0:
            return  # nothing to batch, as in Go
        with self._changed:
            key = (signal_of(data), self._metadata_of_sender())
            pending = self._pending_for(*key)
            accepted_before = pending.count
            try:
                pending.add(data)
            except ValueError as error:
                raise PermanentError(str(error)) from error
            if key not in self._deadlines and self._batching:  # (its timer rests while it is empty)
                self._deadlines[key] = self._next_tick(key)
                self._changed.notify_all()
            sent = 0
            while self._due(pending):
                try:
                    sent += self._send_front(key, SIZE_TRIGGER, refusals_to_caller=True)
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
            for key, pending in self._pending.items():
                while pending.count:
                    self._send_front(key, TIMEOUT_TRIGGER, refusals_to_caller=False)

    # -- helpers, called with self._changed held ------------------------------------------------

    def _metadata_of_sender(self) -> Metadata:
        """The values of ``metadata_keys`` in the sender's request metadata: the batch key."""
        client = pycollector.client.current()
        return tuple((key.lower(), client.get(key)) for key in self._config.metadata_keys)

    def _pending_for(self, signal: str, metadata: Metadata) -> Pending | SerializedPending:
        key = (signal, metadata)
        pending = self._pending.get(key)
        if pending is None:
            combinations = sum(1 for known_signal, _ in self._pending if known_signal == signal)
            if self._config.metadata_keys and combinations >= self._config.metadata_cardinality_limit:
                log_once(self._log, (*self._where, "metadata_cardinality_limit", signal), "error",
                         "too many metadata value combinations; data with a new one is refused for good",
                         setting="metadata_cardinality_limit", limit=self._config.metadata_cardinality_limit)
                raise PermanentError(f"too many batcher metadata-value combinations (metadata_cardinality_limit {self._config.metadata_cardinality_limit})")
            pending = self._pending[key] = pending_for(signal)  # (its timer starts with its first data: consume)
            self._telemetry.batchers(len(self._pending))
        return pending

    def _due(self, pending: Pending | SerializedPending) -> bool:
        """Send now: the batch is full, or nothing is batching and all goes out at once."""
        if not self._batching:
            return pending.count > 0
        return pending.count >= self._config.send_batch_size

    def _send_front(self, key: BatchKey, trigger: str, refusals_to_caller: bool) -> int:
        """Send one batch off the front of the batch held under ``key``; returns how many items
        left it. Downstream sees the batch's metadata as its client, nothing else of the senders'."""
        pending = self._pending[key]
        size = min(pending.count, self._config.send_batch_max_size or pending.count)
        batch, rest = pending.cut(size)
        _, metadata = key
        client = pycollector.client.ClientInfo(metadata={name: values for name, values in metadata if values})
        try:
            with pycollector.client.client_context(client):
                self._next.consume(batch)
        except Exception as error:  # any downstream failure; the timer thread must survive it
            if refusals_to_caller and isinstance(error, RefusedError):
                raise
            self._telemetry.dropped(pending.signal, size, error)
        else:
            self._telemetry.sent(trigger, size)
        pending.keep(rest, pending.count - size)
        self._ticks[key] = time.monotonic()
        self._deadlines[key] = self._ticks[key] + self._config.timeout
        return size

    def _next_tick(self, key: BatchKey) -> float:
        """When the timer of a batch that rested empty ticks next: as if it had ticked every
        ``timeout`` since its last tick (Go's batch processor's timer does, empty or not)."""
        now, timeout = time.monotonic(), self._config.timeout
        last = self._ticks.get(key, now)
        return last + max(1, -(-(now - last) // timeout)) * timeout

    def _send_timed_out(self) -> None:
        """The timer thread: sends each signal's batch ``timeout`` after its previous send. A
        batch found empty at its deadline rests, its timer with it, until data comes (consume
        sets its next tick): an agent that reports every few seconds is not woken five times a
        second for nothing."""
        with self._changed:
            while self._batching:
                now = time.monotonic()
                for key, deadline in list(self._deadlines.items()):
                    if deadline <= now:
                        pending = self._pending[key]
                        while pending.count:
                            self._send_front(key, TIMEOUT_TRIGGER, refusals_to_caller=False)
                        self._ticks[key] = now
                        del self._deadlines[key]
                next_deadline = min(self._deadlines.values(), default=None)
                self._changed.wait(None if next_deadline is None else max(0.0, next_deadline - time.monotonic()))
