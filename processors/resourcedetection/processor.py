"""The resource detection processor: what the detectors found about this host, on the resource of
every message (each ResourceProfiles, ResourceSpans...), as Go's resource_detection does.

Detection runs at start, bounded by ``timeout`` (a failing detector is tried again each second
until then, as Go retries); if it fails, the collector does not start, as in Go: an agent that
would send profiles without its host's name is worse than one that says why it cannot start. With
``refresh_interval`` it runs again in the background, keeping the last result when a run fails.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from pycollector.component import Component, Consumer, StartError
from pycollector.pdata import resource_entries
from pycollector.pdata.attributes import to_any_value
from pycollector.periodic import Periodic

from processors.resourcedetection.detectors import DetectionError, detect

RETRY_SECONDS = 1.0


class ResourceDetectionProcessor(Component):
    def __init__(self, settings, config, next_consumer: Consumer, environ: dict[str, str] | None = None):
        self._log = settings.logger
        self._config = config
        self._next = next_consumer
        self._environ = environ
        self._detected: dict[str, Any] = {}
        self._refresh: Periodic | None = None

    def start(self, host) -> None:
        try:
            self._detected = self._detect_within(self._config.timeout)
        except DetectionError as error:
            raise StartError(f"resource detection failed: {error}") from None
        self._log.info("detected resource attributes", detectors=",".join(self._config.detectors), **self._detected)
        if self._config.refresh_interval > 0:
            self._refresh = Periodic("resource-detection", self._config.refresh_interval, self._refresh_once, self._log)
            self._refresh.start()

    def _detect_within(self, timeout: float) -> dict[str, Any]:
        """Detect, trying again each second until ``timeout``; a detection that hangs (a resolver
        that never answers) is abandoned at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            outcome: dict[str, Any] = {}
            worker = threading.Thread(target=self._detect_into, args=(outcome,), name="resource-detection", daemon=True)
            worker.start()
            worker.join(max(0.0, deadline - time.monotonic()))
            if worker.is_alive():
                raise DetectionError(f"no result within the timeout ({timeout:g} s)")
            if "error" not in outcome:
                return outcome["attributes"]
            if time.monotonic() + RETRY_SECONDS >= deadline:
                raise outcome["error"]
            time.sleep(RETRY_SECONDS)

    def _detect_into(self, outcome: dict) -> None:
        try:
            outcome["attributes"] = detect(self._config, self._environ, self._log)
        except DetectionError as error:
            outcome["error"] = error

    def _refresh_once(self) -> None:
        try:
            self._detected = self._detect_within(self._config.timeout)
        except DetectionError as error:
            self._log.warning("resource detection failed again; keeping the last result", error=str(error))

    def consume(self, data: Any) -> None:
        detected = self._detected
        if detected:
            for entry in resource_entries(data):
                _apply(entry.resource.attributes, detected, self._config.override)
        self._next.consume(data)

    def shutdown(self) -> None:
        if self._refresh is not None:
            self._refresh.close(timeout=1.0)


def _apply(attributes, detected: dict[str, Any], override: bool) -> None:
    """Detected attributes into an OTLP ``repeated KeyValue``: replacing those of the same key when
    ``override``, else only where the key is missing."""
    at = {kv.key: index for index, kv in enumerate(attributes)}
    for key, value in detected.items():
        if key in at:
            if override:
                attributes[at[key]].value.CopyFrom(to_any_value(value))
        else:
            attributes.add(key=key, value=to_any_value(value))
