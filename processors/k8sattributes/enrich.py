"""Add what is known about a resource's pod, container, namespace and node to its attributes.

An attribute the resource already has is never overwritten (an empty string counts as unset, as
in Go), so values the sender set win over everything the cluster says.
"""

from __future__ import annotations

from typing import Any

from pycollector.pdata.attributes import from_any_value, to_any_value

from processors.k8sattributes.config import FROM_JOB
from processors.k8sattributes.rules import Container, ExtractionRules, PodRecord
from processors.k8sattributes.store import MetadataStore

RESTART_COUNT = "k8s.container.restart_count"


class ResourceAttributes:
    """A resource's `repeated KeyValue`, readable as a dict and filled in place."""

    def __init__(self, key_values: Any):
        self._key_values = key_values
        self._positions = {kv.key: index for index, kv in enumerate(key_values)}
        self.values = {kv.key: from_any_value(kv.value) for kv in key_values}

    def string(self, key: str) -> str:
        value = self.values.get(key)
        return value if isinstance(value, str) else ""

    def fill(self, key: str, value: Any) -> None:
        """Set ``key`` unless the resource already has a (non-empty) value for it."""
        if not value or self.values.get(key) not in (None, ""):
            return
        position = self._positions.get(key)
        if position is None:
            self._positions[key] = len(self._key_values)
            entry = self._key_values.add()
            entry.key = key
        else:
            entry = self._key_values[position]
        entry.value.CopyFrom(to_any_value(value))
        self.values[key] = value


class Enricher:
    def __init__(self, rules: ExtractionRules, store: MetadataStore):
        self._rules, self._store = rules, store

    def enrich(self, resource: ResourceAttributes, pod: PodRecord | None) -> None:
        if pod is not None:
            for key, value in pod.attributes.items():
                resource.fill(key, value)
            self._container(resource, pod)
            for source, workload in self._store.workloads_of(pod):
                for key, value in workload.attributes.items():
                    resource.fill(key, value)
                if source == FROM_JOB and self._rules.wants("k8s.cronjob.uid"):
                    resource.fill("k8s.cronjob.uid", workload.cronjob_uid)
            if self._rules.wants("k8s.cluster.uid"):
                resource.fill("k8s.cluster.uid", self._store.cluster_uid())
        # Namespace and node attributes apply even without a pod, to a resource that names them.
        namespace_name = pod.namespace if pod else resource.string("k8s.namespace.name")
        if namespace_name:
            namespace = self._store.namespace(namespace_name)
            for key, value in (namespace.attributes if namespace else {}).items():
                resource.fill(key, value)
            if self._rules.wants("service.namespace"):
                resource.fill("service.namespace", namespace_name)
        node_name = pod.node if pod else resource.string("k8s.node.name")
        node = self._store.node(node_name) if node_name else None
        if node is not None:
            for key, value in node.attributes.items():
                resource.fill(key, value)
            if self._rules.wants("k8s.node.uid"):
                resource.fill("k8s.node.uid", node.uid)

    def _container(self, resource: ResourceAttributes, pod: PodRecord) -> None:
        container = _container_of(resource, pod)
        if container is None:
            return
        for key, value in container.attributes.items():
            resource.fill(key, value)
        run = container.runs.get(_restart_count(resource, container))
        if run is not None:
            resource.fill("container.id", run.container_id)
            resource.fill("container.image.repo_digests", [run.repo_digest] if run.repo_digest else None)


def _container_of(resource: ResourceAttributes, pod: PodRecord) -> Container | None:
    """By k8s.container.name, else by container.id; a pod with one container needs neither."""
    name, container_id = resource.string("k8s.container.name"), resource.string("container.id")
    if name:
        return pod.containers_by_name.get(name)
    if container_id:
        return pod.containers_by_id.get(container_id)
    if len(pod.containers_by_name) == 1:
        return next(iter(pod.containers_by_name.values()))
    return None


def _restart_count(resource: ResourceAttributes, container: Container) -> int:
    """The run the resource names (k8s.container.restart_count), else the latest."""
    named = resource.values.get(RESTART_COUNT)
    if isinstance(named, int) or (isinstance(named, str) and named.isdigit()):
        return int(named)
    return max(container.runs, default=-1)
