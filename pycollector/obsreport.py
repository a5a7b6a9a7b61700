"""Counting around components, so every plugin reports the Go collector's metrics for free.

Receivers: ``otelcol_receiver_accepted_<items>`` / ``..._refused_<items>`` / ``..._failed_<items>``.
Processors: ``otelcol_processor_incoming_items`` / ``..._outgoing_items`` (label ``otel_signal``).
Exporters: ``otelcol_exporter_sent_<items>`` / ``..._send_failed_<items>``.
Items per signal: profile samples, spans, metric points, log records.
"""

from __future__ import annotations

from typing import Any

from pycollector.component import Consumer, RefusedError
from pycollector.pdata import ITEM_NAMES, item_count, signal_of
from pycollector.telemetry import ComponentTelemetry


class ItemCounters:
    """Per-signal counters named ``<prefix>_<outcome>_<items>``, created on first use."""

    def __init__(self, telemetry: ComponentTelemetry, prefix: str, what: str):
        self.telemetry, self.prefix, self.what = telemetry, prefix, what
        self._cache: dict[tuple[str, str], Any] = {}

    def add(self, outcome: str, signal: str, count: int) -> None:
        key = (outcome, signal)
        counter = self._cache.get(key)
        if counter is None:
            items = ITEM_NAMES[signal]
            name = f"{self.prefix}_{outcome}_{items}"
            counter = self._cache[key] = self.telemetry.counter(name, f"Number of {items.replace('_', ' ')} {self.what} {outcome.replace('_', ' ')}.")
        counter.inc(count)


class ReceiverObserver:
    """Wraps a receiver's next consumer: what it pushed was accepted, refused or failed."""

    def __init__(self, next_consumer: Consumer, telemetry: ComponentTelemetry):
        self.next_consumer = next_consumer
        self._counters = ItemCounters(telemetry, "otelcol_receiver", "the receiver pushed into the pipeline and that were")
        self.signals = getattr(next_consumer, "signals", None)

    def consume(self, data: Any) -> None:
        signal, count = signal_of(data), item_count(data)
        try:
            self.next_consumer.consume(data)
        except RefusedError:
            self._counters.add("refused", signal, count)
            raise
        except Exception:
            self._counters.add("failed", signal, count)
            raise
        self._counters.add("accepted", signal, count)


class ProcessorObserver:
    """Counts items into a processor; ``outgoing`` wraps its next consumer to count items out."""

    def __init__(self, processor: Any, telemetry: ComponentTelemetry):
        self.processor = processor
        self._incoming = telemetry.counter("otelcol_processor_incoming_items", "Number of items passed to the processor.", ("otel_signal",))
        self._outgoing = telemetry.counter("otelcol_processor_outgoing_items", "Number of items emitted from the processor.", ("otel_signal",))

    def consume(self, data: Any) -> None:
        self._incoming.labels(otel_signal=signal_of(data)).inc(item_count(data))
        self.processor.consume(data)

    def outgoing(self, next_consumer: Consumer) -> Consumer:
        return _Counted(next_consumer, self._outgoing)


class _Counted:
    def __init__(self, next_consumer: Consumer, counter: Any):
        self.next_consumer, self.counter = next_consumer, counter

    def consume(self, data: Any) -> None:
        self.next_consumer.consume(data)
        self.counter.labels(otel_signal=signal_of(data)).inc(item_count(data))


class ExporterObserver:
    """Wraps an exporter's consume: items sent, or failed to send (and the error goes upstream)."""

    def __init__(self, exporter: Any, telemetry: ComponentTelemetry):
        self.exporter = exporter
        self._counters = ItemCounters(telemetry, "otelcol_exporter", "the exporter")

    def consume(self, data: Any) -> None:
        signal, count = signal_of(data), item_count(data)
        try:
            self.exporter.consume(data)
        except Exception:
            self._counters.add("send_failed", signal, count)
            raise
        self._counters.add("sent", signal, count)
