"""Settings of the otlp receiver, with the Go ``otlp`` receiver's keys and defaults.

As in Go, a protocol is on when its key is present: ``grpc:`` with no value serves gRPC with the
defaults, and leaving ``http`` out serves no HTTP. With no ``protocols`` at all both are served.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import pydantic

from pycollector.auth import AuthSettings, HttpServerAuthSettings
from pycollector.component import ComponentConfig, OptionalSection, only_go_default
from pycollector.config.servers import (
    CorsSettings,
    KeepaliveEnforcementPolicy,
    KeepaliveServer,
    KeepaliveServerParameters,
    ListenerSettings,
    Middlewares,
    ServerTLSSettings,
    response_header_map,
)
from pycollector.config.types import NonNegativeDuration, OpaqueString, parse_duration
from pycollector.otlp import OTLP_SIGNALS

DEFAULT_GRPC_ENDPOINT = "localhost:4317"
DEFAULT_HTTP_ENDPOINT = "localhost:4318"
DEFAULT_MAX_REQUEST_BODY_SIZE = 20 * 1024 * 1024
DEFAULT_PROFILES_WIRE_VERSION = "auto"
DEFAULT_TRACES_URL_PATH = OTLP_SIGNALS["traces"].http_path
DEFAULT_METRICS_URL_PATH = OTLP_SIGNALS["metrics"].http_path
DEFAULT_LOGS_URL_PATH = OTLP_SIGNALS["logs"].http_path


# A % not followed by two hex digits, which Go's URL parser refuses.
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
# What a body may be compressed with when compression_algorithms is not given: Go's list, but the
# snappy and lz4 framings, which no library here reads.
DEFAULT_COMPRESSION_ALGORITHMS = ("", "gzip", "zstd", "zlib", "deflate")
_NOT_DECODED = ("snappy", "lz4", "x-snappy-framed")
_NoReadTimeout = only_go_default(0.0, "a request is read as long as it takes (idle_timeout closes idle connections)", parse_duration)
_NoWriteTimeout = only_go_default(0.0, "an answer is written as long as it takes", parse_duration)


class _ServerSettings(ListenerSettings):
    tls: OptionalSection[ServerTLSSettings] = None
    # Hand the request's metadata (gRPC metadata, HTTP headers) to the processors downstream, as
    # pycollector.client.current().metadata. The client's address is handed down always.
    include_metadata: bool = False
    middlewares: Middlewares = None


class GrpcServerSettings(_ServerSettings):
    endpoint: str = DEFAULT_GRPC_ENDPOINT
    # Who may send: an authenticator extension (bearertokenauth, basicauth) checks each request.
    auth: OptionalSection[AuthSettings] = None
    max_recv_msg_size_mib: int = pydantic.Field(0, ge=0)
    max_concurrent_streams: int = pydantic.Field(0, ge=0)
    # The socket reads and the HTTP/2 writes of a connection are done in pieces of these sizes (bytes).
    read_buffer_size: int = pydantic.Field(512 * 1024, ge=0)
    write_buffer_size: int = pydantic.Field(0, ge=0)
    keepalive: OptionalSection[KeepaliveServer] = KeepaliveServer(server_parameters=KeepaliveServerParameters(), enforcement_policy=KeepaliveEnforcementPolicy())


class HttpServerSettings(_ServerSettings):
    endpoint: str = DEFAULT_HTTP_ENDPOINT
    auth: OptionalSection[HttpServerAuthSettings] = None
    # Applies to the body as sent and again once decompressed; 0 or less: the default, as in Go.
    max_request_body_size: int = DEFAULT_MAX_REQUEST_BODY_SIZE
    cors: OptionalSection[CorsSettings] = None
    # Sent with every answer (a map, or a list of {name, value}); values are opaque.
    response_headers: dict[str, OpaqueString] = {}
    # The Content-Encodings a request body may have; others are refused (415).
    compression_algorithms: list[str] = list(DEFAULT_COMPRESSION_ALGORITHMS)
    # A connection that carries no request this long is closed (0: never); with keep-alives off,
    # every connection carries one request.
    idle_timeout: NonNegativeDuration = 0.0
    keep_alives_enabled: bool = True
    read_timeout: _NoReadTimeout = None
    read_header_timeout: _NoReadTimeout = None
    write_timeout: _NoWriteTimeout = None
    traces_url_path: str = DEFAULT_TRACES_URL_PATH
    metrics_url_path: str = DEFAULT_METRICS_URL_PATH
    logs_url_path: str = DEFAULT_LOGS_URL_PATH

    @pydantic.field_validator("max_request_body_size")
    @classmethod
    def _positive_or_default(cls, value: int) -> int:
        return value if value > 0 else DEFAULT_MAX_REQUEST_BODY_SIZE

    @pydantic.field_validator("response_headers", mode="before")
    @classmethod
    def _headers(cls, value: Any) -> Any:
        return response_header_map(value)

    @pydantic.field_validator("compression_algorithms", mode="before")
    @classmethod
    def _algorithms(cls, value: Any) -> Any:
        if value is None:
            return list(DEFAULT_COMPRESSION_ALGORITHMS)
        for name in value if isinstance(value, list) else ():
            if name in _NOT_DECODED:
                raise ValueError(f"not supported by pycollector: {name!r} (gzip, zstd, zlib, deflate, or '' for none)")
        return value

    @pydantic.field_validator("traces_url_path", "metrics_url_path", "logs_url_path")
    @classmethod
    def _absolute_path(cls, value: str) -> str:
        # As Go's SanitizedURLPath: what Go's URL parser refuses is refused; keep the path part,
        # and make it absolute.
        if value.startswith(":"):
            raise ValueError("invalid HTTP URL path set for signal: missing protocol scheme")
        if _BAD_ESCAPE.search(value) or any(ord(character) < 0x20 or ord(character) == 0x7F for character in value):
            raise ValueError("invalid HTTP URL path set for signal: a bad %-escape or a control character")
        path = urlsplit(value).path
        return path if path.startswith("/") else "/" + path

    @pydantic.model_validator(mode="after")
    def _one_path_per_signal(self) -> "HttpServerSettings":
        # (Go accepts it and then fails at start, two handlers on one path)
        paths = [self.traces_url_path, self.metrics_url_path, self.logs_url_path]
        if len(set(paths)) != len(paths):
            raise ValueError(f"traces_url_path, metrics_url_path and logs_url_path must differ (got {', '.join(paths)})")
        return self

    def url_paths(self) -> dict[str, str]:
        """The URL path of each signal; profiles has no key in Go and keeps its fixed path."""
        return {
            "profiles": OTLP_SIGNALS["profiles"].http_path,
            "traces": self.traces_url_path,
            "metrics": self.metrics_url_path,
            "logs": self.logs_url_path,
        }


class Protocols(ComponentConfig):
    # (written, even empty, is on; enabled: false is off; absent is off)
    grpc: OptionalSection[GrpcServerSettings] = None
    http: OptionalSection[HttpServerSettings] = None

    @pydantic.model_serializer(mode="wrap")
    def _leave_out_protocols_that_are_off(self, serialize: Any) -> dict[str, Any]:
        # A protocol written as null would be read back as "on with defaults".
        return {key: value for key, value in serialize(self).items() if value is not None}


class OtlpReceiverConfig(ComponentConfig):
    # As in Go, a config names its protocols (the default built in code serves both).
    required_as_written = ("protocols",)
    protocols: Protocols = Protocols(grpc=GrpcServerSettings(), http=HttpServerSettings())
    # The profiles.proto layout senders write: "auto" recognizes it in each request (a body that
    # fits none is refused with the reason); "1.8", "1.9" or "1.10" reads every request as that.
    profiles_wire_version: str = DEFAULT_PROFILES_WIRE_VERSION

    @pydantic.field_validator("profiles_wire_version", mode="before")
    @classmethod
    def _auto_or_a_version(cls, value: Any) -> str:
        if value == "auto":
            return value
        from pycollector.otlp.profiles_wire import parse_version  # the proto classes load only when used

        try:
            return parse_version(value)
        except ValueError as error:
            raise ValueError(f"expected 'auto' or a version: {error}") from None

    @pydantic.model_validator(mode="after")
    def _some_protocol(self) -> "OtlpReceiverConfig":
        if self.protocols.grpc is None and self.protocols.http is None:
            raise ValueError("must specify at least one protocol (protocols::grpc or protocols::http) when using the otlp receiver")
        return self
