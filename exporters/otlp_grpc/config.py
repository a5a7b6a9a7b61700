"""Settings of the otlp_grpc exporter, named and defaulted as the Go ``otlp`` exporter's.

As in Go, a config must give the endpoint (the default built in code is the OTLP/gRPC port on
this host, as the OpenTelemetry SDKs have it). As in Go, TLS is on unless ``tls::insecure`` is set (or forced by an
``https://`` endpoint).
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic

from pycollector.component import ComponentConfig, OptionalSection
from pycollector.auth import AuthSettings
from pycollector.config.servers import Middlewares, WithOptionalSections, grpc_buffer_options
from pycollector.config.types import DEFAULT_PROFILES_WIRE_VERSION, Headers, NonNegativeDuration, ProfilesWireVersion
from pycollector.exporterhelper import QueueSettings, RetrySettings
from pycollector.exporterhelper.tls import ClientTLSSettings

DEFAULT_ENDPOINT = "localhost:4317"
DEFAULT_COMPRESSION = "gzip"
DEFAULT_TIMEOUT = 5.0
DEFAULT_BALANCER_NAME = "round_robin"
# What Go's gRPC client offers and grpcio does not.
_NOT_IN_GRPCIO = frozenset({"zstd", "snappy"})


class KeepaliveClient(ComponentConfig):
    # Ping the server after this long without activity, and give up on it after this long
    # without an answer; permit_without_stream: ping even with no RPC open. (0: gRPC's own.)
    time: NonNegativeDuration = 0.0
    timeout: NonNegativeDuration = 0.0
    permit_without_stream: bool = False

    def grpc_options(self) -> list[tuple[str, int]]:
        options = [("grpc.keepalive_permit_without_calls", int(self.permit_without_stream))]
        if self.time:
            options.append(("grpc.keepalive_time_ms", int(self.time * 1000)))
        if self.timeout:
            options.append(("grpc.keepalive_timeout_ms", int(self.timeout * 1000)))
        return options


class OtlpGrpcConfig(WithOptionalSections):
    required_as_written = ("endpoint",)  # (Go has no default endpoint)
    endpoint: str = DEFAULT_ENDPOINT
    tls: ClientTLSSettings = ClientTLSSettings()
    # Sent with every request. The values are opaque (auth tokens): [REDACTED] in print-config
    # and in messages.
    headers: Headers = {}
    # "" and "none" both send uncompressed, as in Go.
    compression: Literal["gzip", "deflate", "none", ""] = DEFAULT_COMPRESSION
    # How long one export call may take; 0 waits as long as it takes.
    timeout: NonNegativeDuration = DEFAULT_TIMEOUT
    # Wait for the connection to be ready instead of failing the call at once while it is down.
    wait_for_ready: bool = False
    balancer_name: Literal["round_robin", "pick_first"] = DEFAULT_BALANCER_NAME
    # Overrides the :authority header (the virtual host a proxy routes by).
    authority: str = ""
    # Overrides the user agent gRPC sends.
    user_agent: str = ""
    keepalive: OptionalSection[KeepaliveClient] = None
    # A connection reads from its socket, and gathers before writing, this much at a time (bytes).
    read_buffer_size: int = pydantic.Field(0, ge=0)
    write_buffer_size: int = pydantic.Field(512 * 1024, ge=0)
    # The credentials each request carries: an authenticator extension's (bearertokenauth, basicauth).
    auth: OptionalSection[AuthSettings] = None
    middlewares: Middlewares = None
    retry_on_failure: RetrySettings = RetrySettings()
    sending_queue: QueueSettings = QueueSettings()
    # The profiles.proto layout the backend reads: "1.10" (current), "1.9" (Collector 0.139-0.147,
    # Pyroscope 1.18/1.19), "1.8" (older). See the README's table.
    profiles_wire_version: ProfilesWireVersion = DEFAULT_PROFILES_WIRE_VERSION

    @pydantic.field_validator("compression", mode="before")
    @classmethod
    def _offered_by_grpcio(cls, value: Any) -> Any:
        # A Go config naming zstd is likely; say why it fails rather than only list what works.
        if value in _NOT_IN_GRPCIO:
            raise ValueError(f"{value!r} is not available for gRPC in Python (grpcio has gzip and deflate); use gzip, or otlp_http, which has zstd")
        return value

    @pydantic.model_validator(mode="after")
    def _verification_grpcio_can_do(self) -> "OtlpGrpcConfig":
        if self.tls.insecure_skip_verify:
            raise ValueError("tls::insecure_skip_verify: not supported by pycollector: grpcio always verifies the server certificate; "
                             "name its CA in tls::ca_file (or use otlp_http)")
        return self

    def grpc_options(self) -> list[tuple[str, Any]]:
        """The gRPC core arguments these settings make."""
        options: list[tuple[str, Any]] = [("grpc.lb_policy_name", self.balancer_name)]
        if self.authority:
            options.append(("grpc.default_authority", self.authority))
        if self.user_agent:
            options.append(("grpc.primary_user_agent", self.user_agent))
        options += grpc_buffer_options(self.read_buffer_size, self.write_buffer_size)
        if self.keepalive is not None:
            options += self.keepalive.grpc_options()
        if self.uses_tls() and self.tls.server_name_override:
            options.append(("grpc.ssl_target_name_override", self.tls.server_name_override))
        return options

    @pydantic.field_validator("endpoint")
    @classmethod
    def _target(cls, value: str) -> str:
        if value.startswith("unix:"):
            if not value[len("unix:"):].lstrip("/"):
                raise ValueError("unix socket path cannot be empty (e.g. unix:///run/otel.sock)")
            return value
        target = _without_scheme(value)
        host, colon, port = target.rpartition(":")
        if not colon or not host or not port.isdigit():
            raise ValueError(f"expected host:port (optionally after http:// or https://), e.g. '{DEFAULT_ENDPOINT}'")
        return value

    def target(self) -> str:
        """The address gRPC dials: the endpoint without an http(s):// or dns:/// prefix."""
        return _without_scheme(self.endpoint)

    def uses_tls(self) -> bool:
        # Go: plaintext only when `insecure` is set and no CA is given, unless https:// says TLS.
        plaintext = self.tls.insecure and not self.tls.ca_file
        return self.endpoint.startswith("https://") or not plaintext


def _without_scheme(endpoint: str) -> str:
    for prefix in ("https://", "http://", "dns:///", "dns://"):
        if endpoint.startswith(prefix):
            return endpoint[len(prefix):]
    return endpoint
