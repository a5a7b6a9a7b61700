"""The health_check extension: 200 with a JSON body while every pipeline runs, 503 naming the
component that failed, whether it is told by the running service or by status events directly."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from pycollector.component import Component, Factory, StartError
from pycollector.config.validate import build_plan
from pycollector.service import Service
from pycollector.testing import TestHost, assert_conformance, make_settings, registry_with

from extensions.health_check.factory import factory
from tests.components import Journal, factories

PIPELINE = {
    "receivers": {"recorder": {}},
    "exporters": {"keeper": {}},
    "extensions": {"health_check": {"endpoint": "localhost:0", "path": "/health"}},
    "service": {
        "extensions": ["health_check"],
        "pipelines": {"profiles": {"receivers": ["recorder"], "exporters": ["keeper"]}},
        "telemetry": {"metrics": {"level": "none"}},
    },
}


def probe(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture
def extension():
    extension = factory.create(make_settings("extensions", "health_check"), factory.config_model(endpoint="localhost:0"), None)
    extension.start(TestHost())
    yield extension
    extension.shutdown()


def test_keeps_the_contract():
    assert_conformance(factory, "extensions", {"endpoint": "localhost:0"})


def test_healthy_only_once_a_receiver_runs_and_everything_is_ok(extension):
    assert probe(extension.url) == (503, {"status": "Server not available", "reason": "no pipeline has started yet", "components": {}})
    extension.on_component_status("exporters::otlp", "starting", None)
    assert probe(extension.url)[1]["reason"] == "starting: exporters::otlp"
    extension.on_component_status("exporters::otlp", "ok", None)
    extension.on_component_status("receivers::profiling", "ok", None)
    status, body = probe(extension.url)
    assert status == 200 and body["status"] == "Server available"
    assert body["components"] == {"exporters::otlp": "ok", "receivers::profiling": "ok"} and body["upSince"] and body["uptime"]


def test_a_component_in_trouble_is_named_until_it_recovers(extension):
    extension.on_component_status("receivers::profiling", "ok", None)
    extension.on_component_status("exporters::otlp", "recoverable_error", ConnectionError("backend unreachable"))
    status, body = probe(extension.url)
    assert status == 503 and body["reason"] == "exporters::otlp recoverable_error: backend unreachable"
    assert body["components"]["exporters::otlp"] == {"status": "recoverable_error", "error": "backend unreachable"}
    extension.on_component_status("exporters::otlp", "ok", None)
    assert probe(extension.url)[0] == 200


def test_shutting_down_is_not_healthy(extension):
    extension.on_component_status("receivers::profiling", "ok", None)
    extension.on_component_status("receivers::profiling", "stopping", None)
    assert probe(extension.url)[1]["reason"] == "shutting down: receivers::profiling"


def started(**settings):
    extension = factory.create(make_settings("extensions", "health_check"), factory.config_model.model_validate({"endpoint": "localhost:0", **settings}), None)
    extension.start(TestHost())
    return extension


def test_the_root_path_answers_every_path_and_another_only_its_own(extension):
    """As Go's routes: "/" (the default) matches every path; "/health" only itself."""
    assert probe(extension.url + "elsewhere")[0] == 503
    health = started(path="/health")
    try:
        assert probe(health.url)[0] == 503 and probe(health.url.replace("/health", "/elsewhere"))[0] == 404
    finally:
        health.shutdown()


def test_response_body_tls_and_keep_alive_as_go(tmp_path):
    import http.client
    import ssl
    import subprocess

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    extension = started(endpoint="127.0.0.1:0", tls={"cert_file": str(cert), "key_file": str(key)}, keep_alives_enabled=True,
                        response_body={"healthy": "I'm OK", "unhealthy": "I'm not well"})
    try:
        assert extension.url.startswith("https://")
        host, port = extension.url.split("//")[1].split("/")[0].split(":")
        connection = http.client.HTTPSConnection(host, int(port), context=ssl.create_default_context(cafile=str(cert)), timeout=5)
        for expected_status, expected_body in ((503, b"I'm not well"), (200, b"I'm OK")):
            if expected_status == 200:
                extension.on_component_status("receivers::profiling", "ok", None)
            connection.request("GET", "/")  # (the same connection, kept alive)
            response = connection.getresponse()
            assert (response.status, response.read(), response.getheader("Content-Type")) == (expected_status, expected_body, "text/plain; charset=utf-8")
    finally:
        extension.shutdown()


@pytest.mark.parametrize("settings, problem", [
    ({"http": {"endpoint": "localhost:13133"}}, "extensions::health_check::http: not supported by pycollector: Go's v2 health check"),
    ({"cors": {"allowed_origins": ["*"]}}, "extensions::health_check::cors: not supported by pycollector: Go's health_check answers without it too"),
    ({"check_collector_pipeline": {"enabled": True}}, "extensions::health_check::check_collector_pipeline::enabled: not supported by pycollector"),
    ({"transport": "unix"}, "extensions::health_check::transport"),
])
def test_what_it_does_not_do_is_refused_by_name(settings, problem):
    from tests.test_processors_support import problems_of

    problems = problems_of("extensions", "health_check", settings)
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_a_running_service_is_healthy():
    journal = Journal()
    service = Service(build_plan(json.loads(json.dumps(PIPELINE)), registry_with(**factories(journal))))
    service.start()
    try:
        status, body = probe(service.extensions["health_check"].url)
    finally:
        service.shutdown()
    assert status == 200, body
    assert body["components"] == {"extensions::health_check": "ok", "exporters::keeper": "ok", "receivers::recorder": "ok"}


class _HoldShutdown(Component):
    """An extension that holds the service's shutdown until the test has probed: health_check,
    listed first, is shut down last and still answers meanwhile."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def shutdown(self) -> None:
        self.entered.set()
        self.release.wait(10)


def test_an_exporter_that_cannot_start_is_named():
    journal = Journal()
    journal.fail_start.add("keeper")
    holder = _HoldShutdown()

    class HolderFactory(Factory):
        type = "hold_shutdown"

        def create(self, settings, config, next_consumer):
            return holder

    config = json.loads(json.dumps(PIPELINE))
    config["extensions"]["hold_shutdown"] = {}
    config["service"]["extensions"].append("hold_shutdown")
    components = factories(journal)
    components["extensions"]["hold_shutdown"] = HolderFactory()
    service = Service(build_plan(config, registry_with(**components)))
    outcome = []

    def start():
        try:
            service.start()
        except StartError as error:
            outcome.append(error)

    starting = threading.Thread(target=start)
    starting.start()
    try:
        assert holder.entered.wait(10)
        status, body = probe(service.extensions["health_check"].url)
    finally:
        holder.release.set()
        starting.join()
    assert [str(error) for error in outcome] == ["exporters::keeper: failed to start: backend unreachable"]
    assert status == 503 and body["reason"] == "exporters::keeper failed: backend unreachable", body
    assert body["components"]["exporters::keeper"] == {"status": "failed", "error": "backend unreachable"}
