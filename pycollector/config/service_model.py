"""The ``service`` section's ``telemetry`` settings, with the Go collector's keys."""

from __future__ import annotations

from typing import Any, Literal

import pydantic

from pycollector.component import ComponentConfig

DEFAULT_METRICS_ADDRESS = "localhost:8888"


class LogsTelemetry(ComponentConfig):
    level: Literal["debug", "info", "warn", "error", "DEBUG", "INFO", "WARN", "ERROR"] = "info"
    encoding: Literal["console", "json"] | None = None
    # Keys of the Go collector's zap settings that have no meaning here; accepted so configs run.
    development: bool = False
    disable_caller: bool = False
    disable_stacktrace: bool = False
    sampling: dict[str, Any] | None = None
    output_paths: list[str] | None = None
    error_output_paths: list[str] | None = None
    initial_fields: dict[str, Any] | None = None
    processors: list[Any] | None = None


class MetricsTelemetry(ComponentConfig):
    level: Literal["none", "basic", "normal", "detailed"] = "normal"
    # Older Go configs say `address`; newer ones declare a pull reader with a prometheus exporter.
    address: str | None = None
    readers: list[dict[str, Any]] | None = None

    def listen_address(self) -> tuple[str, int] | None:
        """host, port to serve /metrics on, or None when metrics are off."""
        if self.level == "none":
            return None
        if self.readers:
            for reader in self.readers:
                prometheus = _prometheus_of(reader)
                if prometheus is not None:
                    return str(prometheus.get("host", "localhost")), int(prometheus.get("port", 8888))
            return None
        host, _, port = (self.address or DEFAULT_METRICS_ADDRESS).rpartition(":")
        # ":8888" means every interface, as in Go.
        return host.strip("[]") or "0.0.0.0", int(port)

    @pydantic.field_validator("address")
    @classmethod
    def _check_address(cls, value: str | None) -> str | None:
        if value is not None:
            host, colon, port = value.rpartition(":")
            if not colon or not port.isdigit() or int(port) > 65535:
                raise ValueError(f"expected host:port, e.g. '{DEFAULT_METRICS_ADDRESS}'")
        return value

    @pydantic.field_validator("readers")
    @classmethod
    def _check_readers(cls, readers: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for index, reader in enumerate(readers or ()):
            prometheus = _prometheus_of(reader)
            port = None if prometheus is None else prometheus.get("port", 8888)
            if prometheus is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535):
                raise ValueError(f"readers[{index}]: pull::exporter::prometheus::port must be a port number (got {port!r})")
        return readers


def _prometheus_of(reader: Any) -> dict | None:
    """The ``pull: {exporter: {prometheus: {...}}}`` settings of a reader, if it is one."""
    if not isinstance(reader, dict):
        return None
    return ((reader.get("pull") or {}).get("exporter") or {}).get("prometheus")


class TelemetrySettings(ComponentConfig):
    logs: LogsTelemetry = LogsTelemetry()
    metrics: MetricsTelemetry = MetricsTelemetry()
    traces: dict[str, Any] | None = None
    resource: dict[str, Any] | None = None
