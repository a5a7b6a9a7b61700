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


def test_only_the_configured_path_answers(extension):
    assert probe(extension.url + "elsewhere")[0] == 404


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
