"""Settings of the health_check extension, with the Go extension's keys and defaults (contrib
v0.156, its legacy mode: Go's v2 ``http``/``grpc`` sections need a feature gate it has off, and are
refused here by name).

Go's server settings that change nothing in Go's health_check (cors, auth, response headers,
middlewares: its legacy handler ignores them) are accepted at their defaults and refused otherwise,
rather than accepted and ignored.
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic

from pycollector.component import ComponentConfig, OptionalSection, not_supported, only_go_default
from pycollector.config.servers import Dialer, Middlewares, RefusedAuth, ServerTLSSettings, WithOptionalSections
from pycollector.config.types import parse_duration
from pycollector.http_server import Endpoint

DEFAULT_ENDPOINT = "localhost:13133"
DEFAULT_PATH = "/"

_NoEffect = "Go's health_check answers without it too"
_IgnoredByGo = only_go_default(None, _NoEffect, lambda value: value or None)
_NoBody = only_go_default(0, "a health check reads no request body")
_NoRequestTimeout = only_go_default(0.0, "a health check answers at once", parse_duration)
_NoMetadata = only_go_default(False, "a health check hands nothing to pipelines")
_NoV2 = not_supported("Go's v2 health check needs the feature gate extension.healthcheck.useComponentStatus, which pycollector does not have")
_NoV2Switch = only_go_default(False, "Go's v2 health check needs the feature gate extension.healthcheck.useComponentStatus")
_PipelineCheckOff = only_go_default(False, "Go's health_check ignores check_collector_pipeline since it reports component status")


class ResponseBody(ComponentConfig):
    """Plain bodies instead of the JSON status: what a load balancer's check matches."""

    healthy: str = ""
    unhealthy: str = ""


class CheckCollectorPipeline(ComponentConfig):
    enabled: _PipelineCheckOff = None
    interval: str = "5m"
    exporter_failure_threshold: int = 5


class HealthCheckConfig(WithOptionalSections):
    endpoint: Endpoint = DEFAULT_ENDPOINT
    transport: Literal["tcp", "tcp4", "tcp6"] = "tcp"
    dialer: Dialer | None = None
    tls: OptionalSection[ServerTLSSettings] = None
    # The URL path that answers; "/" answers every path, as Go's "/" route does.
    path: str = DEFAULT_PATH
    response_body: ResponseBody | None = None
    # Go's health_check closes each connection after its answer unless this is set.
    keep_alives_enabled: bool = False
    check_collector_pipeline: CheckCollectorPipeline | None = None
    cors: _IgnoredByGo = None
    auth: RefusedAuth = None
    response_headers: _IgnoredByGo = None
    middlewares: Middlewares = None
    include_metadata: _NoMetadata = None
    max_request_body_size: _NoBody = None
    compression_algorithms: _IgnoredByGo = None
    read_timeout: _NoRequestTimeout = None
    read_header_timeout: _NoRequestTimeout = None
    write_timeout: _NoRequestTimeout = None
    idle_timeout: _NoRequestTimeout = None
    http: _NoV2 = None
    grpc: _NoV2 = None
    component_health: _NoV2 = None
    use_v2: _NoV2Switch = None

    @pydantic.field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"must start with / (got {value!r})")
        return value

    @pydantic.field_validator("response_body", mode="before")
    @classmethod
    def _present_means_plain(cls, value: Any) -> Any:
        return {} if value is None else value
