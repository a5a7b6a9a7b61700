"""Settings of the loadbalancing exporter, with the Go contrib exporter's keys: ``protocol::otlp``
(the otlp_grpc exporter's settings; the endpoint is each backend's), ``resolver`` (``static``
hostnames, ``dns`` or a Kubernetes Service's ready endpoints, ``k8s``), ``routing_key`` (for profiles, metrics and logs: ``service``, the default,
``resource`` or ``attributes`` with ``routing_attributes``).

One difference: the sending queue and retries are the balancer's, not each backend's, so that
what a backend that went away did not take is sent to the others. They are the top-level
``sending_queue``/``retry_on_failure`` when written, else ``protocol::otlp``'s (where Go keeps
each backend's).
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic

from pycollector.component import ComponentConfig, OptionalSection, as_written, not_supported
from pycollector.config.servers import WithOptionalSections
from pycollector.config.types import Duration, NonNegativeDuration
from pycollector.exporterhelper import QueueSettings, RetrySettings

from exporters.otlp_grpc.config import OtlpGrpcConfig

DEFAULT_PORT = "4317"
PLACEHOLDER_ENDPOINT = "placeholder:4317"  # (as Go's: protocol::otlp's endpoint is each backend's)


class StaticResolverSettings(ComponentConfig):
    hostnames: list[str] = []


class DnsResolverSettings(ComponentConfig):
    # Resolved (A and AAAA) every interval, each lookup within timeout; a backend is ip:port.
    hostname: str = ""
    port: str = ""
    interval: Duration = pydantic.Field(5.0, gt=0)
    timeout: Duration = pydantic.Field(1.0, gt=0)

    @pydantic.field_validator("port", mode="before")
    @classmethod
    def _port_as_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value  # (port: 4317, as configs write it)


class K8sResolverSettings(ComponentConfig):
    # "name.namespace" (no namespace: this pod's, else "default"); a backend is a ready
    # endpoint's address (or, with return_hostnames, its hostname.name.namespace) with each port.
    service: str = ""
    ports: list[int] = [int(DEFAULT_PORT)]
    timeout: Duration = pydantic.Field(1.0, gt=0)  # how long a start waits for the first list
    return_hostnames: bool = False

    @pydantic.field_validator("ports")
    @classmethod
    def _ports(cls, ports: list[int]) -> list[int]:
        wrong = [port for port in ports if not 0 < port < 65536]
        if wrong:
            raise ValueError(f"not a port: {wrong[0]}")
        return ports or [int(DEFAULT_PORT)]


_NoCloudMap = not_supported("no AWS Cloud Map resolver (the static, dns and k8s resolvers are)")


class ResolverSettings(WithOptionalSections):
    optional_sections = frozenset({"static", "dns", "k8s"})
    static: OptionalSection[StaticResolverSettings] = None
    dns: OptionalSection[DnsResolverSettings] = None
    k8s: OptionalSection[K8sResolverSettings] = None
    aws_cloud_map: _NoCloudMap


class ProtocolSettings(ComponentConfig):
    otlp: OtlpGrpcConfig = OtlpGrpcConfig(endpoint=PLACEHOLDER_ENDPOINT)

    @pydantic.field_validator("otlp", mode="before")
    @classmethod
    def _each_backend_has_its_endpoint(cls, value: Any) -> Any:
        if isinstance(value, dict) and not value.get("endpoint"):
            return {**value, "endpoint": PLACEHOLDER_ENDPOINT}
        return {"endpoint": PLACEHOLDER_ENDPOINT} if value is None else value


class LoadBalancingConfig(WithOptionalSections):
    protocol: ProtocolSettings = ProtocolSettings()
    resolver: ResolverSettings = ResolverSettings()
    routing_key: Literal["", "service", "resource", "attributes", "traceID", "metric", "streamID"] = ""
    routing_attributes: list[str] = []
    timeout: NonNegativeDuration = 0.0
    retry_on_failure: RetrySettings | None = None
    sending_queue: QueueSettings | None = None

    @pydantic.field_validator("routing_key")
    @classmethod
    def _keys_of_resources(cls, value: str) -> str:
        if value in ("traceID", "metric", "streamID"):
            raise ValueError(f"not supported by pycollector: routing by {value} (profiles, metrics and logs go by a resource's "
                             "service, resource or attributes)")
        return value

    @pydantic.model_validator(mode="after")
    def _one_resolver(self, info: pydantic.ValidationInfo) -> "LoadBalancingConfig":
        if self.routing_key == "attributes" and not self.routing_attributes:
            raise ValueError('routing_attributes must be specified when routing_key is "attributes"')
        if self.routing_attributes and self.routing_key != "attributes":
            raise ValueError(f'routing_attributes can only be used when routing_key is "attributes"; got "{self.routing_key}". '
                             'Remove routing_attributes or set routing_key to "attributes"')
        if not as_written(info):
            return self  # (the default, which print-config shows, names no backend)
        resolvers = [name for name in ("static", "dns", "k8s") if getattr(self.resolver, name) is not None]
        if not resolvers:
            raise ValueError("no resolvers specified for the exporter")
        if len(resolvers) > 1:
            raise ValueError("only one resolver should be specified")
        if self.resolver.static is not None and not self.resolver.static.hostnames:
            raise ValueError("no endpoints specified for the static resolver")
        if self.resolver.dns is not None and not self.resolver.dns.hostname:
            raise ValueError("no hostname specified to resolve the backends")
        if self.resolver.k8s is not None and not self.resolver.k8s.service:
            raise ValueError("no service specified to resolve the backends")
        return self

    def key(self) -> str:
        return self.routing_key or "service"

    def backend(self, endpoint: str) -> OtlpGrpcConfig:
        """protocol::otlp for one backend: its endpoint (Go's default port when it names none), and
        no queue or retries of its own (the balancer's re-route what a backend does not take)."""
        return self.protocol.otlp.model_copy(update={
            "endpoint": endpoint if _has_port(endpoint) else f"{endpoint}:{DEFAULT_PORT}",
            "retry_on_failure": RetrySettings(enabled=False),
            "sending_queue": QueueSettings(enabled=False),
        })

    def balancer_retry(self) -> RetrySettings:
        return self.retry_on_failure or self.protocol.otlp.retry_on_failure

    def balancer_queue(self) -> QueueSettings:
        return self.sending_queue or self.protocol.otlp.sending_queue


def _has_port(endpoint: str) -> bool:
    if endpoint.startswith("["):
        return "]:" in endpoint
    return ":" in endpoint
