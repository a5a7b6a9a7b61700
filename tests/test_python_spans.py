"""Span -> profile, end to end, for a Python service as users run one: the real OpenTelemetry SDK
with pycollector's writer switched on by one environment variable, its spans sent over OTLP to
the otlp receiver (a traces pipeline to a file), its CPU and off-CPU samples taken in BPF by the
profiling receiver. Load comes from two client threads calling /checkout (three times the CPU
of /browse) and /browse in turn, and /slow (a sleep).

What must hold: the samples linked to a route's spans are in that route's handler; the routes'
shares of the linked samples follow the CPU their handlers measured; nearly every sample taken
inside a handler carries its span; the handler that sleeps shows its wait under its span; the
profiles carry the SDK's service.name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from pycollector.config.validate import build_plan
from pycollector.pdata import iter_samples, sample_type
from pycollector.service import Service
from pycollector.testing import CapturingExporterFactory, receiver_of, registry_with

from tests.conftest import bpf_unavailable_reason

pytest.importorskip("pycollector_otel_context", reason="the writer is installed by `make setup` (pip install ./sdk/python)")

SERVICE = Path(__file__).parents[1] / "examples" / "span-profiles" / "service.py"
HANDLER_OF_ROUTE = {"/checkout": "checkout_total", "/browse": "browse_catalog", "/slow": "wait_for_inventory"}
LOAD_SECONDS = 8


@pytest.fixture
def collector(tmp_path):
    if bpf_unavailable_reason():
        pytest.skip(bpf_unavailable_reason())
    capture = CapturingExporterFactory()
    config = {
        "receivers": {
            "profiling": {"samples_per_second": 99, "reporter_interval": "1s", "off_cpu_threshold": 1.0,
                          "unwind_cache_dir": str(tmp_path / "cache")},
            "otlp": {"protocols": {"http": {"endpoint": "127.0.0.1:0"}}},
        },
        "exporters": {"capture": {}, "file/traces": {"path": str(tmp_path / "traces.jsonl")}},
        "service": {
            "pipelines": {
                "profiles": {"receivers": ["profiling"], "exporters": ["capture"]},
                "traces": {"receivers": ["otlp"], "exporters": ["file/traces"]},
            },
            "telemetry": {"metrics": {"level": "none"}},
        },
    }
    service = Service(build_plan(config, registry_with(exporters={"capture": capture})))
    service.start()
    otlp = receiver_of(service, "otlp")
    yield capture, "http://{}:{}/v1/traces".format(*otlp.http_address), tmp_path / "traces.jsonl"
    service.shutdown()


def run_load(base: str, seconds: float) -> dict:
    """Two clients, each calling the routes in turn; the CPU each route's handlers measured."""
    cpu = {route: 0.0 for route in HANDLER_OF_ROUTE}
    lock = threading.Lock()

    def client():
        with requests.Session() as session:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for route in ("/checkout", "/browse", "/slow"):
                    answer = session.get(base + route, timeout=10)
                    answer.raise_for_status()
                    with lock:
                        cpu[route] += float(answer.headers["X-Cpu-Seconds"])

    threads = [threading.Thread(target=client) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return cpu


def spans_by_route(path: Path, timeout: float = 15) -> dict:
    """{route: {span id}} of the spans the traces pipeline wrote, once their count holds still."""
    deadline, last = time.monotonic() + timeout, None
    while True:
        routes: dict = {}
        if path.exists():
            for line in path.read_text().splitlines():
                for resource_spans in json.loads(line).get("resourceSpans", []):
                    for scope_spans in resource_spans.get("scopeSpans", []):
                        for span in scope_spans.get("spans", []):
                            route = next((a["value"].get("stringValue") for a in span.get("attributes", []) if a["key"] == "http.route"), None)
                            routes.setdefault(route, set()).add(bytes.fromhex(span["spanId"]))
        count = sum(len(ids) for ids in routes.values())
        if count and count == last or time.monotonic() > deadline:
            return routes
        last = count
        time.sleep(1)


@pytest.mark.bpf
def test_a_python_services_samples_carry_the_spans_they_ran_in(collector):
    capture, traces_url, traces_file = collector
    service = subprocess.Popen([sys.executable, str(SERVICE), traces_url], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "OTEL_PYTHON_CONTEXT": "pycollector_thread_context"})
    try:
        base = f"http://127.0.0.1:{service.stdout.readline().strip()}"
        # Warm-up: the agent finds the process, its interpreter and its contexts (at its first
        # report after the SDK published them: samples before carry no span), then a report of
        # load alone.
        messages = capture.consumer.messages
        deadline = time.monotonic() + 30
        while not any(view.link for message in messages for view in iter_samples(message) if view.resource.get("process.pid") == service.pid):
            assert time.monotonic() < deadline, "no sample of the service linked to a span in 30 s"
            run_load(base, 0.5)
        run_load(base, 1.5)
        seen = len(messages)
        cpu = run_load(base, LOAD_SECONDS)
        requests.get(base + "/flush", timeout=10)
        time.sleep(2.5)  # the last samples reported
        spans = spans_by_route(traces_file)
        cpu_samples, waits, names = [], {}, set()
        for message in messages[seen:]:
            for view in iter_samples(message):
                if view.resource.get("process.pid") != service.pid:
                    continue
                names.add(view.resource.get("service.name"))
                functions = {frame.function for frame in view.frames}
                kind = sample_type(message, view.profile)[0]
                if kind == "off_cpu":
                    if "wait_for_inventory" in functions:
                        waits[view.link] = waits.get(view.link, 0) + sum(view.values)
                else:
                    cpu_samples.append((functions, view.link[1] if view.link else None, sum(view.values)))
    finally:
        service.kill()
        service.wait()

    route_of_span = {span_id: route for route, ids in spans.items() for span_id in ids}
    assert names == {"shop"}, names
    # The samples linked to a route's spans ran in that route's handler.
    linked: dict = {}
    for functions, span_id, count in cpu_samples:
        route = route_of_span.get(span_id)
        if route in ("/checkout", "/browse"):
            inside = linked.setdefault(route, [0, 0])
            inside[0] += count * (HANDLER_OF_ROUTE[route] in functions)
            inside[1] += count
    for route, (inside, total) in linked.items():
        assert total > 30 and inside / total >= 0.9, (route, inside, total)
    assert set(linked) == {"/checkout", "/browse"}, linked
    print("\nlinked samples in their handler: " + ", ".join(f"{route} {inside}/{total}" for route, (inside, total) in linked.items()))
    # Their shares follow the CPU the handlers measured.
    measured = cpu["/checkout"] / (cpu["/checkout"] + cpu["/browse"])
    sampled = linked["/checkout"][1] / (linked["/checkout"][1] + linked["/browse"][1])
    print(f"/checkout share: sampled {sampled:.3f}, measured CPU {measured:.3f}")
    assert abs(sampled - measured) <= 0.05, (sampled, measured, cpu, linked)
    # Nearly every sample taken inside a handler carries its span.
    in_handler = carrying = 0
    for functions, span_id, count in cpu_samples:
        for route in ("/checkout", "/browse"):
            if HANDLER_OF_ROUTE[route] in functions:
                in_handler += count
                carrying += count * (route_of_span.get(span_id) == route)
    print(f"handler samples carrying their span: {carrying}/{in_handler}")
    assert in_handler > 100 and carrying / in_handler >= 0.9, (carrying, in_handler)
    # The handler that sleeps: its wait under its span.
    slow = sum(time for link, time in waits.items() if link and route_of_span.get(link[1]) == "/slow")
    print(f"/slow's off-CPU time under its spans: {slow / 1e9:.2f} s of {sum(waits.values()) / 1e9:.2f} s")
    assert sum(waits.values()) > 0 and slow / sum(waits.values()) >= 0.9, {route_of_span.get(k[1]) if k else None: v for k, v in waits.items()}


def test_the_worked_examples_config_is_valid(cli):
    result = cli("validate", "--config", "examples/span-profiles/collector-config.yaml")
    assert result.returncode == 0, result.stderr
