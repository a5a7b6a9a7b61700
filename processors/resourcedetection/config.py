"""Settings of the resource detection processor, as the Go ``resource_detection`` processor's
(contrib v0.156; ``resourcedetection`` is its older name) for the detectors an agent uses: ``env``,
``system`` and ``k8s_api`` (``k8snode``, its older name, with its own section).

Go's other detectors (the clouds', docker, heroku...) and its HTTP client keys for them are refused
by name: nothing here would act on them.
"""

from __future__ import annotations

from typing import Literal

import pydantic

from pycollector.component import ComponentConfig, not_supported
from pycollector.config.types import NonNegativeDuration

from processors.k8sattributes.config import AUTH_KUBE_CONFIG, AUTH_NONE, AUTH_SERVICE_ACCOUNT

DETECTORS = ("env", "system", "k8s_api", "k8snode")
DEFAULT_TIMEOUT = 5.0
DEFAULT_NODE_ENV_VAR = "K8S_NODE_NAME"
HOSTNAME_SOURCES = ("dns", "os", "cname", "lookup")


class AttributeSwitch(ComponentConfig):
    enabled: bool


def _switches(defaults: dict[str, bool]) -> type[ComponentConfig]:
    """A model of ``resource_attributes``: one ``{enabled: bool}`` per attribute a detector can
    emit, with Go's default; an attribute it cannot emit is an unknown key."""
    fields = {name.replace(".", "_"): (AttributeSwitch, pydantic.Field(AttributeSwitch(enabled=on), alias=name)) for name, on in defaults.items()}
    model = pydantic.create_model("ResourceAttributes", __base__=ComponentConfig, **fields)
    model.model_config = {**ComponentConfig.model_config, "populate_by_name": True, "serialize_by_alias": True}
    model.model_rebuild(force=True)
    return model


# What the system detector can emit, and Go's default for each.
SYSTEM_ATTRIBUTES = {
    "host.name": True, "os.type": True, "host.id": False, "host.arch": False, "host.interface": False, "host.mac": False,
    "host.cpu.vendor.id": False, "host.cpu.family": False, "host.cpu.model.id": False, "host.cpu.model.name": False,
    "host.cpu.stepping": False, "host.cpu.cache.l2.size": False,
    "os.description": False, "os.name": False, "os.version": False, "os.build.id": False,
}
SystemAttributes = _switches(SYSTEM_ATTRIBUTES)
K8S_ATTRIBUTES = {"k8s.node.name": True, "k8s.node.uid": True, "k8s.cluster.uid": True}
K8sAttributes = _switches(K8S_ATTRIBUTES)


class SystemConfig(ComponentConfig):
    # Tried in order until one gives a name (Go's: dns as `hostname -f`, os, cname, lookup).
    hostname_sources: list[Literal["dns", "os", "cname", "lookup"]] = ["dns", "os"]
    resource_attributes: SystemAttributes = SystemAttributes()

    @pydantic.model_validator(mode="before")
    @classmethod
    def _host_ip(cls, data):
        # host.ip needs the addresses of every interface, which this detector does not read.
        enabled = ((data or {}).get("resource_attributes") or {}).get("host.ip", {}) if isinstance(data, dict) else {}
        if isinstance(enabled, dict) and enabled.get("enabled"):
            raise ValueError("resource_attributes::host.ip: not supported by pycollector (host.interface and host.mac are)")
        if isinstance(data, dict) and isinstance(data.get("resource_attributes"), dict) and "host.ip" in data["resource_attributes"]:
            data = {**data, "resource_attributes": {key: value for key, value in data["resource_attributes"].items() if key != "host.ip"}}
        return data


class K8sApiConfig(ComponentConfig):
    auth_type: Literal[AUTH_NONE, AUTH_SERVICE_ACCOUNT, AUTH_KUBE_CONFIG] = AUTH_SERVICE_ACCOUNT
    # kubeConfig only: the context to use instead of the file's current-context.
    context: str = ""
    kube_api_qps: float = pydantic.Field(0, ge=0)  # (accepted; the detector makes two requests a run)
    kube_api_burst: int = pydantic.Field(0, ge=0)
    # The environment variable holding this node's name (the downward API's spec.nodeName).
    node_from_env_var: str = ""
    resource_attributes: K8sAttributes = K8sAttributes()


# Go's sections for its other detectors, and its HTTP client settings (which serve the clouds'
# metadata endpoints): refused by name.
OTHER_DETECTOR_SECTIONS = (
    "akamai", "aks", "alibaba_ecs", "azure", "consul", "digitalocean", "docker", "ec2", "ecs", "eks", "elasticbeanstalk", "gcp",
    "heroku", "hetzner", "ibmcloud_classic", "ibmcloud_vpc", "kubeadm", "lambda", "nova", "openshift", "oraclecloud", "scaleway",
    "tencent_cvm", "upcloud", "vultr",
)
HTTP_CLIENT_KEYS = (
    "endpoint", "proxy_url", "tls", "read_buffer_size", "write_buffer_size", "headers", "compression", "compression_params", "auth",
    "max_idle_conns", "max_idle_conns_per_host", "max_conns_per_host", "idle_conn_timeout", "disable_keep_alives",
    "http2_read_idle_timeout", "http2_ping_timeout", "cookies", "middlewares", "force_attempt_http2",
)
_OtherDetector = not_supported(f"pycollector's detectors are {', '.join(DETECTORS)}")
_HttpClientKey = not_supported("the HTTP client settings serve Go's cloud detectors, which pycollector does not have")


class _ResourceDetectionSettings(ComponentConfig):
    # Run in order; the first to give an attribute wins.
    detectors: list[str] = ["env"]
    # Detected attributes overwrite those the data has (true), or only fill in missing ones.
    override: bool = True
    # How long one detection may take, all detectors together.
    timeout: NonNegativeDuration = DEFAULT_TIMEOUT
    # Detect again this often (0: once, at start).
    refresh_interval: NonNegativeDuration = 0.0
    system: SystemConfig = SystemConfig()
    k8s_api: K8sApiConfig = K8sApiConfig()
    k8snode: K8sApiConfig = K8sApiConfig()

    @pydantic.field_validator("detectors", mode="before")
    @classmethod
    def _known(cls, detectors):
        if isinstance(detectors, str):  # (Go's decoding splits a string on commas)
            detectors = [name.strip() for name in detectors.split(",")]
        for name in detectors if isinstance(detectors, list) else ():
            if name not in DETECTORS:
                known = "" if name in OTHER_DETECTOR_SECTIONS or name in ("elastic_beanstalk", "dynatrace") else " (no such detector)"
                raise ValueError(f"detector '{name}' is not supported by pycollector{known}; supported: {', '.join(DETECTORS)}")
        return detectors


ResourceDetectionConfig = pydantic.create_model(
    "ResourceDetectionConfig",
    __base__=_ResourceDetectionSettings,
    **{name: (_OtherDetector, None) for name in OTHER_DETECTOR_SECTIONS},
    **{name: (_HttpClientKey, None) for name in HTTP_CLIENT_KEYS},
)
