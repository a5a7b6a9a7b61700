"""The k8s resolver: the backends are a Kubernetes Service's ready endpoints, kept current by a
watch on its EndpointSlices (the API that replaced Endpoints), as Go's resolver keeps its
informer's.

``service: name.namespace`` (no namespace: the pod's own, else "default"); each ready endpoint's
address (or, with ``return_hostnames``, ``hostname.name.namespace``, as a StatefulSet's pods are
named) with each of ``ports``. The API is found as Go's controller-runtime finds it: the
kubeconfig KUBECONFIG names, else the pod's service account, else ~/.kube/config. A list or watch
that fails keeps the backends the resolver had and is retried with backoff.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

from pycollector.kubernetes.access import SERVICE_ACCOUNT_DIR, ApiAccess, default_access
from pycollector.kubernetes.watch import DELETED, Collection, Watcher

from exporters.loadbalancing.config import K8sResolverSettings
from exporters.loadbalancing.resolvers import Listener

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def service_and_namespace(service: str, namespace_file: Path | None = None) -> tuple[str, str]:
    name, _, namespace = service.partition(".")
    if namespace:
        return name, namespace
    try:
        return name, (namespace_file or Path(SERVICE_ACCOUNT_DIR) / "namespace").read_text().strip() or "default"
    except OSError:
        return name, "default"


def backends_of(slices: list[dict], settings: K8sResolverSettings, name: str, namespace: str) -> list[str]:
    """Every ready endpoint of the slices, with each port, sorted."""
    found = set()
    for endpoint_slice in slices:
        for endpoint in endpoint_slice.get("endpoints") or []:
            # A nil "ready" means ready (the API's own reading); terminating ones say false.
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            if settings.return_hostnames:
                hosts = [f"{endpoint['hostname']}.{name}.{namespace}"] if endpoint.get("hostname") else []
            else:
                hosts = [f"[{address}]" if ":" in address else address for address in endpoint.get("addresses") or []]
            found.update(f"{host}:{port}" for host in hosts for port in settings.ports)
    return sorted(found)


class K8sResolver:
    name = "k8s"

    def __init__(self, settings: K8sResolverSettings, changed: Listener, telemetry: Any, logger: Any,
                 access: Callable[[], ApiAccess] = default_access) -> None:
        self.settings = settings
        self.service, self.namespace = service_and_namespace(settings.service)
        self.endpoints: list[str] = []
        self._changed = changed
        self._telemetry = telemetry
        self.log = logger
        self._access = access
        self._slices: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._watcher: Watcher | None = None

    def start(self) -> None:
        """Watch the Service's EndpointSlices; wait up to ``timeout`` for the first list (the
        backends come with it, or later)."""
        collection = Collection("endpointslices", f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices",
                                {"labelSelector": f"{SERVICE_NAME_LABEL}={self.service}"})
        self._watcher = Watcher(collection, self._access(), self, self.log, owner="loadbalancing")
        self._watcher.start()
        if not self._watcher.synced.wait(self.settings.timeout):
            self.log.warning("loadbalancing: the Service's endpoints are not listed yet; the backends come when they are",
                             service=f"{self.service}.{self.namespace}", waited_s=self.settings.timeout, error=self._watcher.last_error)

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher.join()

    # -- the watch's sink ------------------------------------------------------------------------

    def replace(self, _kind: str, objects: list[dict]) -> None:
        with self._lock:
            self._slices = {obj["metadata"]["name"]: obj for obj in objects}
        self._resolve()

    def apply(self, _kind: str, event_type: str, obj: dict) -> None:
        with self._lock:
            if event_type == DELETED:
                self._slices.pop(obj["metadata"]["name"], None)
            else:
                self._slices[obj["metadata"]["name"]] = obj
        self._resolve()

    def _resolve(self) -> None:
        with self._lock:
            endpoints = backends_of(list(self._slices.values()), self.settings, self.service, self.namespace)
        self._telemetry.resolutions.labels(resolver=self.name, success="true").inc()
        if endpoints != self.endpoints:
            self.endpoints = endpoints
            self._changed(endpoints)
