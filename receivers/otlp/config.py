"""Settings of the otlp receiver, with the Go ``otlp`` receiver's keys and defaults.

As in Go, a protocol is on when its key is present: ``grpc:`` with no value serves gRPC with the
defaults, and leaving ``http`` out serves no HTTP. With no ``protocols`` at all both are served.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import pydantic

from pycollector.component import ComponentConfig
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


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:4317``, ``:4317`` for every interface) -> (host, port)."""
    host, colon, port = endpoint.rpartition(":")
    if not colon or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected host:port, e.g. '{DEFAULT_GRPC_ENDPOINT}'")
    return host.removeprefix("[").removesuffix("]"), int(port)


class ServerTLSSettings(ComponentConfig):
    cert_file: str
    key_file: str
    # When set, clients must present a certificate signed by one of these CAs (mutual TLS).
    client_ca_file: str = ""


class _ServerSettings(ComponentConfig):
    endpoint: str
    tls: ServerTLSSettings | None = None
    # Hand the request's metadata (gRPC metadata, HTTP headers) to the processors downstream, as
    # pycollector.client.current().metadata. The client's address is handed down always.
    include_metadata: bool = False

    @pydantic.field_validator("endpoint")
    @classmethod
    def _host_and_port(cls, value: str) -> str:
        split_endpoint(value)
        return value


class GrpcServerSettings(_ServerSettings):
    endpoint: str = DEFAULT_GRPC_ENDPOINT
    # 0 keeps gRPC's own limit (4 MiB).
    max_recv_msg_size_mib: int = pydantic.Field(0, ge=0)
    # 0: no limit.
    max_concurrent_streams: int = pydantic.Field(0, ge=0)


class HttpServerSettings(_ServerSettings):
    endpoint: str = DEFAULT_HTTP_ENDPOINT
    # Applies to the body as sent and again once decompressed.
    max_request_body_size: int = pydantic.Field(DEFAULT_MAX_REQUEST_BODY_SIZE, gt=0)
    traces_url_path: str = DEFAULT_TRACES_URL_PATH
    metrics_url_path: str = DEFAULT_METRICS_URL_PATH
    logs_url_path: str = DEFAULT_LOGS_URL_PATH

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

    def url_paths(self) -> dict[str, str]:
        """The URL path of each signal; profiles has no key in Go and keeps its fixed path."""
        return {
            "profiles": OTLP_SIGNALS["profiles"].http_path,
            "traces": self.traces_url_path,
            "metrics": self.metrics_url_path,
            "logs": self.logs_url_path,
        }


class Protocols(ComponentConfig):
    grpc: GrpcServerSettings | None = None
    http: HttpServerSettings | None = None

    @pydantic.field_validator("grpc", "http", mode="before")
    @classmethod
    def _present_means_on(cls, value: Any) -> Any:
        return {} if value is None else value

    @pydantic.model_serializer(mode="wrap")
    def _leave_out_protocols_that_are_off(self, serialize: Any) -> dict[str, Any]:
        # A protocol written as null would be read back as "on with defaults".
        return {key: value for key, value in serialize(self).items() if value is not None}


class OtlpReceiverConfig(ComponentConfig):
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
