"""The k8sattributes processor: find each resource's pod in a watched copy of the cluster and
add its metadata, for profiles, traces, metrics and logs alike (the resource is where it goes)."""

from __future__ import annotations

import os

import time
from typing import Any

import pycollector.client
from pycollector.component import Component, Consumer, StartError
from pycollector.config.types import format_duration
from pycollector.pdata import resource_entries, signal_of

from processors.k8sattributes.association import POD_IP, Associations
from pycollector.kubernetes.access import ApiAccess, AuthError, api_access
from processors.k8sattributes.config import FROM_CONNECTION, K8sAttributesConfig
from processors.k8sattributes.enrich import Enricher, ResourceAttributes
from processors.k8sattributes.rules import ExtractionRules
from processors.k8sattributes.store import MetadataStore
from processors.k8sattributes.telemetry import K8sTelemetry
from pycollector.kubernetes.watch import Watcher
from processors.k8sattributes.watched import collections_to_watch

class K8sAttributesProcessor(Component):
    def __init__(self, settings, config: K8sAttributesConfig, next_consumer: Consumer):
        self._log = settings.logger
        self._config = config
        self._next = next_consumer
        self._rules = ExtractionRules(config.extract, [pod.name for pod in config.exclude.pods])
        self._associations = Associations(config.pod_association)
        self._telemetry = K8sTelemetry(settings.telemetry)
        self._store = MetadataStore(self._rules, self._associations, self._telemetry, delete_grace_s=config.pod_delete_grace_period)
        self._enricher = Enricher(self._rules, self._store)
        self._access: ApiAccess | None = None
        self._watchers: list[Watcher] = []

    def start(self, host) -> None:
        if self._config.passthrough:
            return  # an agent only tags the pod IP; the gateway it sends to does the rest
        node_variable = self._config.filter.node_from_env_var
        if node_variable and not os.environ.get(node_variable):
            # Read at start, not at validation: configs are validated outside the pod, too.
            self._log.warning("filter::node_from_env_var names an unset variable; watching the pods of every node", variable=node_variable)
        try:
            self._access = api_access(self._config)
        except AuthError as error:
            raise StartError(str(error)) from None
        self._watchers = [Watcher(collection, self._access, self._store, self._log) for collection in collections_to_watch(self._config, self._rules)]
        for watcher in self._watchers:
            watcher.start()
        if self._config.wait_for_metadata:
            self._wait_for_metadata()

    def _wait_for_metadata(self) -> None:
        timeout = self._config.wait_for_metadata_timeout
        deadline = time.monotonic() + timeout
        for watcher in self._watchers:
            watcher.synced.wait(max(0.0, deadline - time.monotonic()))
        pending = [watcher for watcher in self._watchers if not watcher.synced.is_set()]
        if not pending:
            return
        server = self._access.server
        reasons = "; ".join(f"{w.collection.kind}: {w.last_error or 'no answer yet'}" for w in pending)
        self.shutdown()
        raise StartError(
            f"wait_for_metadata: Kubernetes metadata did not sync within {format_duration(timeout)} "
            f"(wait_for_metadata_timeout) from {server}: {reasons}"
        )

    def consume(self, data: Any) -> None:
        signal = signal_of(data)
        client_address = pycollector.client.current().address
        for entry in resource_entries(data):
            resource = ResourceAttributes(entry.resource.attributes)
            identifier = self._associations.of_resource(resource.values, client_address)
            # As Go: a pod IP found by the connection rules is written down, so the gateway this
            # data goes on to (where the client is an agent, not the pod) can still find the pod.
            pod_ip = next((value for source, _, value in identifier or () if source == FROM_CONNECTION), "")
            resource.fill(POD_IP, pod_ip)
            if self._config.passthrough:
                continue
            pod = self._store.pod(identifier) if identifier else None
            self._telemetry.association(pod is not None, signal)
            self._enricher.enrich(resource, pod)
        self._next.consume(data)

    def shutdown(self) -> None:
        for watcher in self._watchers:
            watcher.stop()
        for watcher in self._watchers:
            watcher.join()
        self._watchers = []
        if self._access is not None:
            self._access.close()
            self._access = None
