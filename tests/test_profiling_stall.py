"""A profiling receiver whose report thread is stuck turns the health check unhealthy, naming the
thread and the stage, and healthy again once it moves (issue 25: a blinded agent used to answer
200 while no profile left it).

The pipeline's exporter blocks in consume() until the test lets it go: the report thread waits in
"handing the profile downstream", as it would behind any stage a hostile process could stall."""

from __future__ import annotations

import json
import threading
import time

import pytest

from pycollector.component import Component, Factory
from pycollector.config.validate import build_plan
from pycollector.service import Service
from pycollector.testing import registry_with

from receivers.profiling import receiver as profiling_receiver
from receivers.profiling import stall_watch
from tests.conftest import bpf_unavailable_reason
from tests.test_health_check import probe

pytestmark = pytest.mark.bpf


class BlockingExporterFactory(Factory):
    type = "blocking"

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def create(self, settings, config, next_consumer):
        owner = self

        class Blocking(Component):
            def consume(self, data) -> None:
                owner.entered.set()
                owner.release.wait(60)

        return Blocking()


def wait_for_status(url: str, wanted: int, seconds: float) -> tuple[int, dict]:
    deadline = time.monotonic() + seconds
    while True:
        status, body = probe(url)
        if status == wanted or time.monotonic() > deadline:
            return status, body
        time.sleep(0.2)


def test_a_stuck_report_thread_is_named_by_the_health_check(monkeypatch, tmp_path):
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    monkeypatch.setattr(profiling_receiver, "STALL_ALLOWANCE_S", 2.0)
    monkeypatch.setattr(stall_watch, "CHECK_INTERVAL_S", 0.5)
    blocking = BlockingExporterFactory()
    config = {
        "receivers": {"profiling": {"samples_per_second": 49, "reporter_interval": "1s", "unwind_cache_dir": str(tmp_path / "cache")}},
        "exporters": {"blocking": {}},
        "extensions": {"health_check": {"endpoint": "localhost:0", "path": "/health"}},
        "service": {"extensions": ["health_check"], "pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["blocking"]}},
                    "telemetry": {"metrics": {"level": "none"}}},
    }
    service = Service(build_plan(config, registry_with(exporters={"blocking": blocking})))
    service.start()
    try:
        url = service.extensions["health_check"].url
        assert blocking.entered.wait(30), "no report reached the exporter"
        status, body = wait_for_status(url, 503, 15)
        assert status == 503, body
        assert "report: handing the profile downstream" in json.dumps(body), body
        blocking.release.set()
        status, body = wait_for_status(url, 200, 15)
        assert status == 200, body
    finally:
        blocking.release.set()
        service.shutdown()
