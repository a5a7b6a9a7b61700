"""Settings of the otlp_http exporter, named and defaulted as the Go ``otlphttp`` exporter's.

Each signal goes to ``<endpoint>/v1/traces`` (``/v1development/profiles`` for profiles) unless
its ``<signal>_endpoint`` names a full URL. Go has no default endpoint; this one defaults to the
OTLP/HTTP port on this host, as the OpenTelemetry SDKs do. TLS follows the URL's scheme.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

import pydantic

from pycollector.component import ComponentConfig, OptionalSection, only_go_default
from pycollector.auth import AuthSettings
from pycollector.config.servers import Middlewares, WithOptionalSections
from pycollector.config.types import DEFAULT_PROFILES_WIRE_VERSION, Headers, NonNegativeDuration, ProfilesWireVersion, parse_duration
from pycollector.exporterhelper import QueueSettings, RetrySettings
from pycollector.otlp import OTLP_SIGNALS
from pycollector.exporterhelper.tls import ClientTLSSettings

DEFAULT_ENDPOINT = "http://localhost:4318"
DEFAULT_COMPRESSION = "gzip"
DEFAULT_TIMEOUT = 30.0
DEFAULT_ENCODING = "proto"


_TransportTuning = "the HTTP library's connection pool (one connection per sending thread) has no such setting"
_GoTransport0 = only_go_default(0, _TransportTuning)
_GoWriteBuffer = only_go_default(512 * 1024, _TransportTuning)
_GoMaxIdle = only_go_default(100, _TransportTuning)
_GoIdleTimeout = only_go_default(90.0, _TransportTuning, parse_duration)
_GoHttp2Timeout = only_go_default(0.0, "requests are sent over HTTP/1.1", parse_duration)
_NoHttp2 = only_go_default(False, "requests are sent over HTTP/1.1")


class CompressionParams(ComponentConfig):
    level: int = 0

    @pydantic.field_validator("level")
    @classmethod
    def _range(cls, level: int) -> int:
        if not -2 <= level <= 22:
            raise ValueError("expected a compression level (gzip and deflate: -2 to 9, zstd: 1 to 22; 0: the default)")
        return level


class Cookies(ComponentConfig):
    pass


class OtlpHttpConfig(WithOptionalSections):
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
    # Through this proxy (http:// or https://); none: directly, whatever the environment says.
    proxy_url: str = ""
    # 0: the compressor's default level.
    compression_params: CompressionParams = CompressionParams()
    # Every request on a connection of its own (Connection: close).
    disable_keep_alives: bool = False
    # Keep the cookies the backend sets and send them back (Go's in-memory jar); off: none kept.
    cookies: OptionalSection[Cookies] = None
    # The credentials each request carries: an authenticator extension's (bearertokenauth, basicauth).
    auth: OptionalSection[AuthSettings] = None
    middlewares: Middlewares = None
    # Go's HTTP transport tuning, at Go's defaults: what requests does.
    read_buffer_size: _GoTransport0 = None
    write_buffer_size: _GoWriteBuffer = None
    max_idle_conns: _GoMaxIdle = None
    max_idle_conns_per_host: _GoTransport0 = None
    max_conns_per_host: _GoTransport0 = None
    idle_conn_timeout: _GoIdleTimeout = None
    http2_read_idle_timeout: _GoHttp2Timeout = None
    http2_ping_timeout: _GoHttp2Timeout = None
    force_attempt_http2: _NoHttp2 = None
    retry_on_failure: RetrySettings = RetrySettings()
    sending_queue: QueueSettings = QueueSettings()
    # The profiles.proto layout the backend reads: "1.10" (current), "1.9" (Collector 0.139-0.147,
    # Pyroscope 1.18/1.19), "1.8" (older). See the README's table.
    profiles_wire_version: ProfilesWireVersion = DEFAULT_PROFILES_WIRE_VERSION

    @pydantic.field_validator("proxy_url")
    @classmethod
    def _proxy(cls, value: str) -> str:
        if value and (urlsplit(value).scheme not in ("http", "https", "socks5", "socks5h") or not urlsplit(value).netloc):
            raise ValueError("expected a proxy URL, e.g. 'http://proxy.internal:3128'")
        return value

    @pydantic.model_validator(mode="after")
    def _level_for_its_compressor(self) -> "OtlpHttpConfig":
        level = self.compression_params.level
        if level and self.compression in ("gzip", "deflate") and not -2 <= level <= 9:
            raise ValueError(f"compression_params::level: {self.compression} takes -2 to 9 (got {level})")
        if level and self.compression in ("", "none"):
            raise ValueError("compression_params::level: no compression to set the level of")
        return self

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
