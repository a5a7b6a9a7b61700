"""Settings of the k8sattributes processor: the Go processor's keys and defaults.

Keys, defaults and checks follow the Go ``k8sattributes`` processor, so configs written for it run
here unchanged. One key is ours: ``endpoint``, the API server URL, for an API server that is not
the one the pod's environment names (and for tests); Go always takes it from the environment or
the kubeconfig.
"""

from __future__ import annotations

import os
import re
from typing import Literal

import pydantic

from pycollector.component import ComponentConfig, as_written, only_go_default
from pycollector.config.types import NonNegativeDuration, parse_duration
from pycollector.kubernetes.access import AUTH_KUBE_CONFIG, AUTH_NONE, AUTH_SERVICE_ACCOUNT

DEFAULT_AUTH_TYPE = AUTH_SERVICE_ACCOUNT
DEFAULT_WAIT_FOR_METADATA_TIMEOUT = 10.0  # seconds

FROM_POD = "pod"
FROM_NAMESPACE = "namespace"
FROM_NODE = "node"
FROM_DEPLOYMENT = "deployment"
FROM_STATEFULSET = "statefulset"
FROM_DAEMONSET = "daemonset"
FROM_JOB = "job"
FROM_REPLICASET = "replicaset"
# The workloads labels and annotations may come from: (collection, API group path) of each.
WORKLOADS = {FROM_DEPLOYMENT: ("deployments", "/apis/apps/v1"), FROM_STATEFULSET: ("statefulsets", "/apis/apps/v1"),
             FROM_DAEMONSET: ("daemonsets", "/apis/apps/v1"), FROM_JOB: ("jobs", "/apis/batch/v1"),
             FROM_REPLICASET: ("replicasets", "/apis/apps/v1")}
FROM_RESOURCE_ATTRIBUTE = "resource_attribute"
FROM_CONNECTION = "connection"

# The attributes the Go processor adds when `extract.metadata` is not given (its metadata.yaml
# marks these enabled), in the order its default config lists them.
DEFAULT_METADATA = (
    "container.image.name",
    "container.image.tag",
    "k8s.deployment.name",
    "k8s.namespace.name",
    "k8s.node.name",
    "k8s.pod.name",
    "k8s.pod.start_time",
    "k8s.pod.uid",
)
SUPPORTED_METADATA = frozenset(
    {
        "k8s.namespace.name", "k8s.pod.name", "k8s.pod.uid", "k8s.pod.hostname", "k8s.pod.start_time", "k8s.pod.ip",
        "k8s.deployment.name", "k8s.deployment.uid", "k8s.replicaset.name", "k8s.replicaset.uid",
        "k8s.daemonset.name", "k8s.daemonset.uid", "k8s.statefulset.name", "k8s.statefulset.uid",
        "k8s.job.name", "k8s.job.uid", "k8s.cronjob.name", "k8s.cronjob.uid", "k8s.node.name", "k8s.node.uid",
        "k8s.container.name", "container.id", "container.image.name", "container.image.tag",
        "container.image.repo_digests", "k8s.cluster.uid",
        "service.name", "service.namespace", "service.version", "service.instance.id",
    }
)
# Pods the Go processor never tags unless told otherwise: the Jaeger agent and collector.
DEFAULT_EXCLUDED_PODS = ("jaeger-agent", "jaeger-collector")
MAX_ASSOCIATION_SOURCES = 4  # the Go processor's PodIdentifierMaxLength
LABEL_OPS = ("", "equals", "not-equals", "exists", "does-not-exist")
FIELD_OPS = ("", "equals", "not-equals")

# `from` is a Python keyword, so models with a `from` key are declared through create_model: the
# key is spelled `from` in configs and in print-config, as in Go. Read it with getattr(x, "from").
_FieldExtractFields = pydantic.create_model(
    "_FieldExtractFields",
    __base__=ComponentConfig,
    tag_name=(str, ""),
    key=(str, ""),
    key_regex=(str, ""),
    **{"from": (Literal[FROM_POD, FROM_NAMESPACE, FROM_NODE, FROM_DEPLOYMENT, FROM_STATEFULSET, FROM_DAEMONSET, FROM_JOB, FROM_REPLICASET], FROM_POD)},
)
_AssociationSourceFields = pydantic.create_model(
    "_AssociationSourceFields",
    __base__=ComponentConfig,
    name=(str, ""),
    **{"from": (Literal[FROM_RESOURCE_ATTRIBUTE, FROM_CONNECTION], ...)},
)


class FieldExtractConfig(_FieldExtractFields):
    """One label or annotation to copy: by exact `key`, or every key matching `key_regex`."""

    @pydantic.model_validator(mode="after")
    def _one_way_to_pick_keys(self) -> "FieldExtractConfig":
        if self.key and self.key_regex:
            raise ValueError(f"give key or key_regex, not both (key: {self.key!r}, key_regex: {self.key_regex!r})")
        if not self.key and not self.key_regex:
            raise ValueError("give key (an exact label or annotation name) or key_regex")
        if self.key_regex:
            try:
                re.compile(self.key_regex)
            except re.error as error:
                raise ValueError(f"key_regex {self.key_regex!r} is not a valid regular expression: {error}") from None
        return self


class AssociationSourceConfig(_AssociationSourceFields):
    @pydantic.model_validator(mode="after")
    def _name_for_resource_attributes(self) -> "AssociationSourceConfig":
        if getattr(self, "from") == FROM_RESOURCE_ATTRIBUTE and not self.name:
            raise ValueError("a resource_attribute source needs the attribute's name, e.g. name: container.id")
        return self


class PodAssociationConfig(ComponentConfig):
    # Every source must match for the rule to apply; rules are tried in order.
    sources: list[AssociationSourceConfig] = pydantic.Field(min_length=1, max_length=MAX_ASSOCIATION_SOURCES)


class FieldFilterConfig(ComponentConfig):
    key: str
    value: str = ""
    op: Literal[LABEL_OPS] = ""  # "" means equals


class FilterConfig(ComponentConfig):
    # Only pods on this node (a DaemonSet agent watches its own node's pods).
    node: str = ""
    # Name of an environment variable holding the node name (set from spec.nodeName by the
    # downward API); wins over `node`.
    node_from_env_var: str = ""
    namespace: str = ""

    @pydantic.field_validator("node_from_env_var")
    @classmethod
    def _variable_set(cls, name: str, info: pydantic.ValidationInfo) -> str:
        # As Go's Validate: a node named by a variable the collector was not given filters nothing.
        if name and as_written(info) and not os.environ.get(name):
            raise ValueError(f"environment variable {name} is not set (give it the pod's spec.nodeName through the downward API)")
        return name
    fields: list[FieldFilterConfig] = []
    labels: list[FieldFilterConfig] = []

    @pydantic.field_validator("fields")
    @classmethod
    def _field_ops(cls, fields: list[FieldFilterConfig]) -> list[FieldFilterConfig]:
        for field in fields:
            if field.op not in FIELD_OPS:
                raise ValueError(f"op {field.op!r} (key {field.key!r}) is not supported for field filters; use equals or not-equals")
        return fields

    def node_name(self) -> str:
        return os.environ.get(self.node_from_env_var, "") if self.node_from_env_var else self.node


class ExtractConfig(ComponentConfig):
    metadata: list[str] = list(DEFAULT_METADATA)
    annotations: list[FieldExtractConfig] = []
    labels: list[FieldExtractConfig] = []
    # Every pod annotation resource.opentelemetry.io/<name> becomes the attribute <name>.
    otel_annotations: bool = False
    # Take k8s.deployment.name from the ReplicaSet name (minus its pod-template hash) instead of
    # watching ReplicaSets.
    deployment_name_from_replicaset: bool = False

    @pydantic.field_validator("metadata")
    @classmethod
    def _supported(cls, metadata: list[str]) -> list[str]:
        for field in metadata:
            if field not in SUPPORTED_METADATA:
                raise ValueError(f"{field!r} is not a supported metadata field (supported: {', '.join(sorted(SUPPORTED_METADATA))})")
        return metadata


class ExcludePodConfig(ComponentConfig):
    name: str  # a regular expression matched anywhere in the pod name

    @pydantic.field_validator("name")
    @classmethod
    def _regex(cls, name: str) -> str:
        try:
            re.compile(name)
        except re.error as error:
            raise ValueError(f"{name!r} is not a valid regular expression: {error}") from None
        return name


class ExcludeConfig(ComponentConfig):
    pods: list[ExcludePodConfig] = [ExcludePodConfig(name=name) for name in DEFAULT_EXCLUDED_PODS]


DEFAULT_POD_DELETE_GRACE_PERIOD = 120.0
_GoWatchSync = only_go_default(300.0, "the watch keeps the store as the API server last said; there is no periodic resync", parse_duration)


class K8sAttributesConfig(ComponentConfig):
    auth_type: Literal[AUTH_NONE, AUTH_SERVICE_ACCOUNT, AUTH_KUBE_CONFIG] = DEFAULT_AUTH_TYPE
    # Go's client-side rate limit of API requests (0: client-go's 5/s, bursts of 10). This
    # processor lists each collection once and then watches it: a handful of requests, far under
    # any limit; a non-zero value is accepted, as it bounds nothing here.
    kube_api_qps: float = pydantic.Field(0, ge=0)
    kube_api_burst: int = pydantic.Field(0, ge=0)
    # kubeConfig only: the context to use instead of the file's current-context.
    context: str = ""
    # The API server URL (http:// or https://), instead of the in-cluster environment or the
    # kubeconfig's server; credentials still come from auth_type.
    endpoint: str = ""
    # Only tag resources with the client's pod IP, without talking to the API.
    passthrough: bool = False
    # Block start until the pod table is filled (or fail start after the timeout).
    wait_for_metadata: bool = False
    wait_for_metadata_timeout: NonNegativeDuration = DEFAULT_WAIT_FOR_METADATA_TIMEOUT
    # A deleted pod's attributes still enrich data this long after its deletion (telemetry it sent
    # before it went may arrive after), as Go keeps it.
    pod_delete_grace_period: NonNegativeDuration = DEFAULT_POD_DELETE_GRACE_PERIOD
    watch_sync_period: _GoWatchSync = None
    filter: FilterConfig = FilterConfig()
    extract: ExtractConfig = ExtractConfig()
    # How a resource finds its pod; empty means by pod IP (k8s.pod.ip, ip, host.name).
    pod_association: list[PodAssociationConfig] = []
    exclude: ExcludeConfig = ExcludeConfig()

    @pydantic.field_validator("endpoint")
    @classmethod
    def _url(cls, endpoint: str) -> str:
        if endpoint and not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"endpoint {endpoint!r} must be a URL starting with http:// or https://")
        return endpoint.rstrip("/")
