"""A Kubernetes API server on 127.0.0.1 for the k8sattributes tests, and checks that it speaks
the real wire format: typed lists with metadata.resourceVersion, watch streams of one JSON event
per chunk, and 410 Gone as a Status object (answered to a request or sent as an ERROR event).

Tests drive it: ``put``/``delete`` change an object and notify every open watch of that
collection (or, with ``missed=True``, change it while no watch hears of it); ``expire`` compacts
history: open watches end, and resuming from an older resourceVersion is Gone.
"""

from __future__ import annotations

import contextlib
import copy
import http.server
import json
import re
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import requests

from pycollector.pdata import resource_entries, ProfilesBuilder, to_dict
from pycollector.telemetry import Telemetry
from pycollector.testing import CapturingConsumer, TestHost, make_settings

from processors.k8sattributes.factory import factory

TESTDATA = Path(__file__).parent / "testdata" / "k8s"
COLLECTIONS = {
    "pods": ("v1", "Pod"),
    "namespaces": ("v1", "Namespace"),
    "nodes": ("v1", "Node"),
    "replicasets": ("apps/v1", "ReplicaSet"),
    "deployments": ("apps/v1", "Deployment"),
    "statefulsets": ("apps/v1", "StatefulSet"),
    "daemonsets": ("apps/v1", "DaemonSet"),
    "jobs": ("batch/v1", "Job"),
    "endpointslices": ("discovery.k8s.io/v1", "EndpointSlice"),
}
CLUSTER_SCOPED = {"namespaces", "nodes"}
ROUTE = re.compile(r"^/(?:api/v1|apis/apps/v1|apis/batch/v1|apis/discovery.k8s.io/v1)(?:/namespaces/(?P<namespace>[^/]+))?/"
                   r"(?P<collection>pods|namespaces|nodes|replicasets|deployments|statefulsets|daemonsets|jobs|endpointslices)$")


def fixture(name: str) -> dict:
    return json.loads((TESTDATA / name).read_text())


def status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}


class FakeKubeApi:
    def __init__(self, token: str | None = None, gone_as: str = "http", port: int = 0, first_revision: int = 100):
        self.token = token  # the bearer token every request must carry, if set
        self.gone_as = gone_as  # "http": a 410 answer; "event": an ERROR event in the stream
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.revision = first_revision
        self._objects: dict[str, dict[str, dict]] = {name: {} for name in COLLECTIONS}
        self._history: dict[str, list[tuple[int, str, dict]]] = {name: [] for name in COLLECTIONS}
        self._compacted: dict[str, int] = {name: 0 for name in COLLECTIONS}
        self._epoch: dict[str, int] = {name: 0 for name in COLLECTIONS}
        self._changed = threading.Condition()
        self._stopping = False
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "FakeKubeApi":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self._stopping:
            return
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self._server.shutdown()
        self._server.server_close()

    # -- what tests do ------------------------------------------------------------------

    def put(self, collection: str, obj: dict, missed: bool = False) -> dict:
        """Create or update; open watches get ADDED or MODIFIED."""
        with self._changed:
            key = self._key(obj)
            event = "MODIFIED" if key in self._objects[collection] else "ADDED"
            stored = self._stamp(collection, obj)
            self._objects[collection][key] = stored
            self._record(collection, event, stored, missed)
            return stored

    def delete(self, collection: str, obj: dict, missed: bool = False) -> None:
        with self._changed:
            stored = self._objects[collection].pop(self._key(obj))
            self._next_revision()
            self._record(collection, "DELETED", stored, missed)

    def bookmark(self, collection: str) -> None:
        with self._changed:
            self._history[collection].append((self._next_revision(), "BOOKMARK", {}))
            self._changed.notify_all()

    def _record(self, collection: str, event: str, obj: dict, missed: bool) -> None:
        if not missed:
            self._history[collection].append((self.revision, event, obj))
            self._changed.notify_all()

    def expire(self, collection: str) -> None:
        """Compact history: open watches end, and resuming from any resourceVersion so far is Gone."""
        with self._changed:
            self._compacted[collection] = self._next_revision()
            self._epoch[collection] += 1
            self._changed.notify_all()

    def requested(self, collection: str) -> list[dict[str, str]]:
        return [params for path, params in self.requests if path.endswith("/" + collection)]

    # -- the API ------------------------------------------------------------------------

    def _next_revision(self) -> int:
        self.revision += 1
        return self.revision

    def _stamp(self, collection: str, obj: dict) -> dict:
        api_version, kind = COLLECTIONS[collection]
        stored = {**copy.deepcopy(obj), "apiVersion": api_version, "kind": kind}
        stored["metadata"]["resourceVersion"] = str(self._next_revision())
        return stored

    @staticmethod
    def _key(obj: dict) -> str:
        meta = obj["metadata"]
        return f"{meta.get('namespace', '')}/{meta['name']}"

    @staticmethod
    def _selected(obj: dict, namespace: str | None, field_selector: str, label_selector: str = "") -> bool:
        """In the namespace (if any), matching every term of both selectors (key=value, key!=value)."""
        meta, spec = obj.get("metadata", {}), obj.get("spec", {})
        labels = meta.get("labels") or {}
        for term in filter(None, label_selector.split(",")):
            name, negated, value = re.match(r"^([^!=]+)(!?)=(.*)$", term).groups()
            if (labels.get(name) == value) == bool(negated):
                return False
        fields = {"metadata.name": meta.get("name", ""), "metadata.namespace": meta.get("namespace", ""), "spec.nodeName": spec.get("nodeName", "")}
        if namespace and meta.get("namespace") != namespace:
            return False
        for term in filter(None, field_selector.split(",")):
            name, negated, value = re.match(r"^([^!=]+)(!?)=(.*)$", term).groups()
            if (fields.get(name, "") == value) == bool(negated):
                return False
        return True

    def _list(self, collection: str, namespace: str | None, params: dict) -> dict:
        api_version, kind = COLLECTIONS[collection]
        with self._changed:
            # List items carry neither kind nor apiVersion: the list says them once.
            items = [
                {key: value for key, value in obj.items() if key not in ("kind", "apiVersion")}
                for obj in self._objects[collection].values()
                if self._selected(obj, namespace, params.get("fieldSelector", ""), params.get("labelSelector", ""))
            ]
            return {"kind": f"{kind}List", "apiVersion": api_version, "metadata": {"resourceVersion": str(self.revision)}, "items": items}

    def _handler_class(self):
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                if api._stopping:  # a stopped server drops its kept-alive connections
                    self.close_connection = True
                    return
                url = urlsplit(self.path)
                params = {key: values[-1] for key, values in parse_qs(url.query).items()}
                api.requests.append((url.path, params))
                route = ROUTE.match(url.path)
                if api.token and self.headers.get("Authorization") != f"Bearer {api.token}":
                    return self._json(401, status(401, "Unauthorized", "Unauthorized"))
                if route is None:
                    return self._json(404, status(404, "NotFound", f"the server could not find the requested resource ({url.path})"))
                collection, namespace = route["collection"], route["namespace"]
                if params.get("watch") in ("true", "1"):
                    return self._watch(collection, namespace, params)
                return self._json(200, api._list(collection, namespace, params))

            def _json(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _chunk(self, event: dict) -> None:
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()

            def _watch(self, collection: str, namespace: str | None, params: dict) -> None:
                since = int(params.get("resourceVersion") or 0)
                deadline = time.monotonic() + int(params.get("timeoutSeconds") or 60)
                gone = status(410, "Expired", f"too old resource version: {since} ({api._compacted[collection]})")
                with api._changed:
                    expired, epoch = since < api._compacted[collection], api._epoch[collection]
                if expired and api.gone_as == "http":
                    return self._json(410, gone)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    if expired:
                        return self._chunk({"type": "ERROR", "object": gone})
                    self._stream(collection, namespace, params, since, epoch, deadline, gone)
                    self.wfile.write(b"0\r\n\r\n")
                    self.close_connection = api._stopping
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _stream(self, collection, namespace, params, since, epoch, deadline, gone) -> None:
                api_version, kind = COLLECTIONS[collection]
                while True:
                    with api._changed:
                        pending = [entry for entry in api._history[collection] if entry[0] > since]
                        while not pending and not api._stopping and api._epoch[collection] == epoch and time.monotonic() < deadline:
                            api._changed.wait(0.2)
                            pending = [entry for entry in api._history[collection] if entry[0] > since]
                        stopping, expired = api._stopping, api._epoch[collection] != epoch
                    if expired:  # history this watch would need is gone
                        if api.gone_as == "event":
                            self._chunk({"type": "ERROR", "object": gone})
                        return
                    for revision, event, obj in pending:
                        since = revision
                        if event == "BOOKMARK":
                            self._chunk({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": str(revision)}}})
                        elif api._selected(obj, namespace, params.get("fieldSelector", ""), params.get("labelSelector", "")):
                            self._chunk({"type": event, "object": obj})
                    if stopping or time.monotonic() >= deadline:
                        return

        return Handler


def eventually(condition, timeout: float = 5.0, interval: float = 0.02):
    """Poll ``condition`` until it returns something true; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result or time.monotonic() >= deadline:
            assert result, f"condition not met within {timeout}s"
            return result
        time.sleep(interval)


def test_a_list_is_typed_and_carries_the_collection_resource_version():
    with FakeKubeApi() as api:
        api.put("pods", fixture("pod-checkout.json"))
        body = requests.get(api.url + "/api/v1/pods", timeout=5).json()
    assert body["kind"] == "PodList" and body["apiVersion"] == "v1"
    assert body["metadata"]["resourceVersion"] == "101"
    [item] = body["items"]
    assert "kind" not in item and item["metadata"]["resourceVersion"] == "101"


def test_a_watch_streams_one_event_per_line_from_the_resource_version_given():
    with FakeKubeApi() as api:
        pod = api.put("pods", fixture("pod-checkout.json"))
        response = requests.get(api.url + "/api/v1/pods", params={"watch": "true", "resourceVersion": "100", "timeoutSeconds": "1"}, stream=True, timeout=5)
        assert response.headers["Transfer-Encoding"] == "chunked"
        api.bookmark("pods")
        events = [json.loads(line) for line in response.iter_lines() if line]
    assert [event["type"] for event in events] == ["ADDED", "BOOKMARK"]
    assert events[0]["object"] == pod and events[0]["object"]["kind"] == "Pod"
    assert events[1]["object"]["metadata"] == {"resourceVersion": "102"}


def test_gone_is_a_410_status_object_or_an_error_event():
    for gone_as in ("http", "event"):
        with FakeKubeApi(gone_as=gone_as) as api:
            api.put("pods", fixture("pod-checkout.json"))
            api.expire("pods")
            response = requests.get(api.url + "/api/v1/pods", params={"watch": "true", "resourceVersion": "100"}, stream=True, timeout=5)
            body = response.json() if gone_as == "http" else json.loads(next(line for line in response.iter_lines() if line))["object"]
        assert (response.status_code, body["kind"], body["code"], body["reason"]) == ((410 if gone_as == "http" else 200), "Status", 410, "Expired")


def test_field_selectors_filter_lists_and_watches():
    other = fixture("pod-checkout.json")
    other["metadata"]["name"], other["spec"]["nodeName"] = "elsewhere", "node-b"
    with FakeKubeApi() as api:
        api.put("pods", fixture("pod-checkout.json"))
        api.put("pods", other)
        body = requests.get(api.url + "/api/v1/pods", params={"fieldSelector": "spec.nodeName=node-a"}, timeout=5).json()
    assert [item["metadata"]["name"] for item in body["items"]] == ["checkout-6f7c9d8b4d-x2x9q"]


# -- helpers the k8sattributes tests share ----------------------------------------------------

def checkout_cluster(api: FakeKubeApi) -> None:
    """The shop namespace with one pod of the checkout Deployment (through its ReplicaSet) on node-a."""
    for collection, name in (("namespaces", "namespace-kube-system.json"), ("namespaces", "namespace-shop.json"), ("nodes", "node-a.json"),
                             ("replicasets", "replicaset-checkout.json"), ("pods", "pod-checkout.json")):
        api.put(collection, fixture(name))


def container_id(pod: dict, container: str) -> str:
    """The bare id a profiler reports for a container (the status has `containerd://<id>`)."""
    status = next(s for s in pod["status"]["containerStatuses"] if s["name"] == container)
    return status["containerID"].split("://", 1)[1]


# The extract and association settings of the eBPF profiling DaemonSet (testdata/k8s/daemonset-profiling.yaml).
PROFILING_METADATA = [
    "k8s.namespace.name", "k8s.node.name", "k8s.pod.name", "k8s.pod.uid", "k8s.deployment.name", "k8s.container.name",
    "container.image.name", "container.image.tag", "container.image.repo_digests",
    "service.namespace", "service.name", "service.version", "service.instance.id",
]
BY_CONTAINER_ID = [{"sources": [{"from": "resource_attribute", "name": "container.id"}]}]


def profile(**resource_attributes) -> object:
    """A ProfilesData with one resource (and one sample), as the profiling receiver sends per process."""
    builder = ProfilesBuilder()
    stack = builder.stack([builder.location(lines=[(builder.function("work"), 1, 0)])])
    resource = builder.resource_profiles(resource_attributes)
    builder.sample(builder.profile(builder.scope_profiles(resource)), stack, [1])
    return builder.data


def resources_of(message) -> list[dict]:
    return [to_dict(entry.resource.attributes) for entry in resource_entries(message)]


class Running:
    """A started processor, what it passed on, and its metrics."""

    def __init__(self, processor, downstream: CapturingConsumer, telemetry: Telemetry):
        self.processor, self.downstream, self.telemetry = processor, downstream, telemetry

    def resources(self, message) -> list[dict]:
        """Send ``message`` through and return the attributes of its resources as they came out."""
        self.processor.consume(message)
        return resources_of(self.downstream.messages[-1])

    def metric(self, name: str, **labels: str) -> float:
        return self.telemetry.sample(name, {"processor": "k8sattributes", **labels}) or 0.0


@contextlib.contextmanager
def running(config: dict):
    telemetry, downstream = Telemetry(), CapturingConsumer()
    processor = factory.create(make_settings("processors", "k8sattributes", telemetry), factory.config_model.model_validate(config), downstream)
    processor.start(TestHost())
    try:
        yield Running(processor, downstream, telemetry)
    finally:
        processor.shutdown()
