"""Settings of the otlp_http exporter, named and defaulted as the Go ``otlphttp`` exporter's.

Each signal goes to ``<endpoint>/v1/traces`` (``/v1development/profiles`` for profiles) unless
its ``<signal>_endpoint`` names a full URL. Go has no default endpoint; this one defaults to the
OTLP/HTTP port on this host, as the OpenTelemetry SDKs do. TLS follows the URL's scheme.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

import pydantic

from pycollector.config.types import DEFAULT_PROFILES_WIRE_VERSION, Headers, NonNegativeDuration, ProfilesWireVersion
from pycollector.component import ComponentConfig
from pycollector.exporterhelper import QueueSettings, RetrySettings
from pycollector.otlp import OTLP_SIGNALS
from pycollector.exporterhelper.tls import ClientTLSSettings

DEFAULT_ENDPOINT = "http://localhost:4318"
DEFAULT_COMPRESSION = "gzip"
DEFAULT_TIMEOUT = 30.0
DEFAULT_ENCODING = "proto"


class OtlpHttpConfig(ComponentConfig):
    # (Go has no default endpoint: the endpoint, or a signal's own)
    required_as_written = (("endpoint", "traces_endpoint", "metrics_endpoint", "logs_endpoint", "profiles_endpoint"),)
    endpoint: str = DEFAULT_ENDPOINT
    traces_endpoint: str = ""
    metrics_endpoint: str = ""
    logs_endpoint: str = ""
    profiles_endpoint: str = ""
    tls: ClientTLSSettings = ClientTLSSettings()
    # Sent with every request. The values are opaque (auth tokens): [REDACTED] in print-config
    # and in messages.
    headers: Headers = {}
    # "" and "none" both send uncompressed, as in Go.
    compression: Literal["gzip", "deflate", "zstd", "none", ""] = DEFAULT_COMPRESSION
    # How long one request may take; 0 waits as long as it takes.
    timeout: NonNegativeDuration = DEFAULT_TIMEOUT
    encoding: Literal["proto", "json"] = DEFAULT_ENCODING
    retry_on_failure: RetrySettings = RetrySettings()
    sending_queue: QueueSettings = QueueSettings()
    # The profiles.proto layout the backend reads: "1.10" (current), "1.9" (Collector 0.139-0.147,
    # Pyroscope 1.18/1.19), "1.8" (older). See the README's table.
    profiles_wire_version: ProfilesWireVersion = DEFAULT_PROFILES_WIRE_VERSION

    @pydantic.field_validator("endpoint", "traces_endpoint", "metrics_endpoint", "logs_endpoint", "profiles_endpoint")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if value:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"expected an http:// or https:// URL, e.g. '{DEFAULT_ENDPOINT}'")
        return value

    def signal_url(self, signal: str) -> str:
        override = getattr(self, f"{signal}_endpoint")
        return override or self.endpoint.rstrip("/") + OTLP_SIGNALS[signal].http_path
