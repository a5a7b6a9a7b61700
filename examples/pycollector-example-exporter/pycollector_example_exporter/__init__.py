"""An example third-party pycollector exporter: CPU samples per process, appended to a CSV file.

Everything a plugin needs is here: a config model, a factory, the component. pycollector finds it
through the ``pycollector.exporters`` entry point in this distribution's pyproject.toml; nothing
in pycollector names it.
"""

from __future__ import annotations

import collections
import csv
import threading
import time

from pycollector.component import Component, ComponentConfig, Factory, PermanentError
from pycollector.pdata import iter_samples


class SampleCountsConfig(ComponentConfig):
    path: str = "sample_counts.csv"
    # Which resource attribute names a row (one row per value per export).
    group_by: str = "process.executable.name"


class SampleCountsExporter(Component):
    def __init__(self, settings, config: SampleCountsConfig):
        self.config = config
        self.log = settings.logger
        self._lock = threading.Lock()
        self._file = None
        # Plugins get the engine's sent/failed counters for free; this one adds its own.
        self._rows = settings.telemetry.counter("example_sample_counts_rows", "Rows written to the CSV file.")

    def start(self, host) -> None:
        self._file = open(self.config.path, "a", newline="", encoding="utf-8")
        self.log.info("writing sample counts", path=self.config.path)

    def consume(self, data) -> None:
        totals: collections.Counter = collections.Counter()
        for view in iter_samples(data):
            totals[str(view.resource.get(self.config.group_by, "(unknown)"))] += sum(view.values)
        now = time.time()
        with self._lock:
            if self._file is None:
                raise PermanentError("exporter is not started")
            writer = csv.writer(self._file)
            for group, samples in sorted(totals.items()):
                writer.writerow([f"{now:.3f}", group, samples])
            self._file.flush()
        self._rows.inc(len(totals))

    def shutdown(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class SampleCountsFactory(Factory):
    type = "sample_counts"
    signals = frozenset({"profiles"})
    config_model = SampleCountsConfig

    def create(self, settings, config, next_consumer):
        return SampleCountsExporter(settings, config)


factory = SampleCountsFactory()
