"""Self-telemetry: Prometheus metrics with the Go collector's names, served over HTTP.

The engine counts around every component (accepted/refused at receivers, incoming/outgoing at
processors, sent/failed at exporters), so a plugin gets those metrics without writing a line.
A component adds its own through ``settings.telemetry``.
"""

from __future__ import annotations

import resource
import threading
import time
from typing import Iterable

import prometheus_client
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from pycollector.process_memory import resident_bytes

# The Go collector does not expose `_created` series; dashboards built for it do not expect them.
prometheus_client.disable_created_metrics()

# The label that names a component in the Go collector's metrics, per kind.
COMPONENT_LABEL = {
    "receivers": "receiver",
    "processors": "processor",
    "exporters": "exporter",
    "extensions": "extension",
    "connectors": "connector",
}


class Telemetry:
    """All metrics of one running service, in a registry of its own (tests run many services)."""

    def __init__(self, process_metrics: bool = True) -> None:
        """``process_metrics``: this process's otelcol_process_* series (a multi-worker collector's
        supervisor adds its own to its workers' instead)."""
        self.registry = CollectorRegistry(auto_describe=True)
        self.process = ProcessCollector()
        if process_metrics:
            self.registry.register(self.process)
        self._metrics: dict[str, prometheus_client.metrics.MetricWrapperBase] = {}
        self._lock = threading.Lock()
        self._server = None
        self._server_thread = None

    def _get(self, kind: type, name: str, documentation: str, labelnames: Iterable[str], **kwargs):
        labelnames = tuple(labelnames)
        with self._lock:
            metric = self._metrics.get(name)
            if metric is None:
                metric = kind(name, documentation, labelnames, registry=self.registry, **kwargs)
                self._metrics[name] = metric
            elif tuple(metric._labelnames) != labelnames or not isinstance(metric, kind):
                raise ValueError(f"metric {name} already registered with labels {metric._labelnames}")
            return metric

    def counter(self, name: str, documentation: str, labelnames: Iterable[str] = ()) -> prometheus_client.Counter:
        return self._get(prometheus_client.Counter, name, documentation, labelnames)

    def gauge(self, name: str, documentation: str, labelnames: Iterable[str] = ()) -> prometheus_client.Gauge:
        return self._get(prometheus_client.Gauge, name, documentation, labelnames)

    def histogram(self, name: str, documentation: str, labelnames: Iterable[str] = (), buckets=prometheus_client.Histogram.DEFAULT_BUCKETS) -> prometheus_client.Histogram:
        return self._get(prometheus_client.Histogram, name, documentation, labelnames, buckets=buckets)

    def for_component(self, kind: str, component_id: str) -> "ComponentTelemetry":
        return ComponentTelemetry(self, {COMPONENT_LABEL[kind]: component_id})

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """Current value of one series (tests and the debug exporter read their own counters)."""
        return self.registry.get_sample_value(name, labels or {})

    def exposition(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)

    def serve(self, host: str, port: int) -> tuple[str, int]:
        """Serve ``/metrics`` on host:port; returns the bound address (port 0 picks a free one)."""
        self._server, self._server_thread = prometheus_client.start_http_server(port, addr=host, registry=self.registry)
        bound = self._server.server_address
        return bound[0], bound[1]

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class ComponentTelemetry:
    """A component's handle on the service's metrics, with its own label already bound."""

    def __init__(self, telemetry: Telemetry, labels: dict[str, str]):
        self.telemetry = telemetry
        self.labels = labels

    def counter(self, name: str, documentation: str, labelnames: Iterable[str] = ()):
        """A counter child bound to this component; ``labelnames`` are extra labels left to fill."""
        labelnames = tuple(labelnames)
        metric = self.telemetry.counter(name, documentation, (*self.labels, *labelnames))
        return metric.labels(**self.labels) if not labelnames else _PartialLabels(metric, self.labels)

    def gauge(self, name: str, documentation: str, labelnames: Iterable[str] = ()):
        labelnames = tuple(labelnames)
        metric = self.telemetry.gauge(name, documentation, (*self.labels, *labelnames))
        return metric.labels(**self.labels) if not labelnames else _PartialLabels(metric, self.labels)


    def histogram(self, name: str, documentation: str, labelnames: Iterable[str] = (), buckets=prometheus_client.Histogram.DEFAULT_BUCKETS):
        labelnames = tuple(labelnames)
        metric = self.telemetry.histogram(name, documentation, (*self.labels, *labelnames), buckets=buckets)
        return metric.labels(**self.labels) if not labelnames else _PartialLabels(metric, self.labels)


class _PartialLabels:
    """A metric with the component label set and the others still to be given per use."""

    def __init__(self, metric, bound: dict[str, str]):
        self._metric, self._bound = metric, bound

    def labels(self, **labels: str):
        return self._metric.labels(**self._bound, **labels)


class ProcessCollector(Collector):
    """The Go collector's process metrics, read from /proc at scrape time."""

    def __init__(self) -> None:
        self._started = time.time()

    def collect(self):
        uptime = CounterMetricFamily("otelcol_process_uptime", "Uptime of the process", unit="seconds")
        uptime.add_metric([], time.time() - self._started)
        yield uptime
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu = CounterMetricFamily("otelcol_process_cpu_seconds", "Total CPU user and system time", unit="seconds")
        cpu.add_metric([], usage.ru_utime + usage.ru_stime)
        yield cpu
        rss = GaugeMetricFamily("otelcol_process_memory_rss", "Total physical memory (resident set size)", unit="bytes")
        try:
            rss.add_metric([], resident_bytes())
        except OSError:  # no /proc: leave the series out rather than report 0
            pass
        yield rss
