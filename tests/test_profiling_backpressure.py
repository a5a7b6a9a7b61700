"""A refusal downstream does not lose an interval: the receiver holds it and merges it into the
next report; past the bound it drops the held samples and counts them."""

import os
import subprocess
import time

import pytest

from pycollector.component import Component, Factory, RefusedError
from pycollector.config.validate import build_plan
from pycollector.pdata import iter_samples, sample_count
from pycollector.service import Service
from pycollector.testing import registry_with

from tests.conftest import WORKLOADS

pytestmark = pytest.mark.bpf
HZ = 97


class RefusingExporter(Factory):
    """Fails the first ``refusals`` exports with ``error``, then keeps what it gets."""

    type = "refusing"
    signals = frozenset({"profiles"})

    def __init__(self, refusals: int, error=lambda: RefusedError("memory limit reached")):
        self.refusals, self.error, self.calls, self.kept = refusals, error, 0, []

    def create(self, settings, config, next_consumer):
        factory = self

        class Exporter(Component):
            def consume(self, data):
                factory.calls += 1
                if factory.calls <= factory.refusals:
                    raise factory.error()
                factory.kept.append(data)

        return Exporter()


def dropped(service):
    return service.telemetry.sample("pycollector_profiling_dropped_samples_total", {"receiver": "profiling", "reason": "refused"})


def profile_with(exporter: RefusingExporter, binary, seconds: float, until=lambda service: True):
    """Profile the workload; afterwards keep the receiver running until ``until(service)`` holds
    (bounded), so a loaded machine that reports late still reaches the state under test."""
    config = {
        "receivers": {"profiling": {"samples_per_second": HZ, "reporter_interval": "500ms", "reporter_jitter": 0}},
        "exporters": {"refusing": {}},
        "service": {"pipelines": {"profiles": {"receivers": ["profiling"], "exporters": ["refusing"]}}, "telemetry": {"metrics": {"level": "none"}}},
    }
    service = Service(build_plan(config, registry_with(exporters={"refusing": exporter})))
    service.start()
    try:
        workload = subprocess.Popen([str(binary), str(seconds)], stdout=subprocess.DEVNULL)
        _, _, usage = os.wait4(workload.pid, 0)
        time.sleep(0.7)  # one more report after the workload ends
        deadline = time.monotonic() + 15
        while not until(service) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        service.shutdown()
    return service, workload.pid, (usage.ru_utime + usage.ru_stime) * HZ


@pytest.fixture(scope="module")
def known_split(tmp_path_factory):
    binary = tmp_path_factory.mktemp("bp") / "known_split"
    subprocess.run(["gcc", "-O2", "-fno-omit-frame-pointer", "-o", str(binary), str(WORKLOADS / "known_split.c")], check=True)
    return binary


def workload_samples(messages, pid):
    return sum(sum(view.values) for message in messages for view in iter_samples(message) if view.resource.get("process.pid") == pid)


def test_refused_intervals_are_held_and_delivered_with_the_next(known_split):
    exporter = RefusingExporter(refusals=2)
    service, pid, expected = profile_with(exporter, known_split, 2.5)
    received = workload_samples(exporter.kept, pid)
    assert abs(received - expected) <= 3 * expected**0.5 + 5, f"{received} samples delivered for {expected:.0f} expected"
    assert service.telemetry.sample("otelcol_receiver_refused_profile_samples_total", {"receiver": "profiling"}) > 0
    assert dropped(service) is None


def test_refusing_for_ever_drops_held_samples_and_counts_them(known_split):
    exporter = RefusingExporter(refusals=10**6)
    service, _, _ = profile_with(exporter, known_split, 2.5, until=dropped)
    assert exporter.kept == [] and dropped(service) > 0


def test_a_bug_downstream_does_not_stop_profiling(known_split):
    exporter = RefusingExporter(refusals=1, error=lambda: ValueError("a bug in some exporter"))
    service, pid, _ = profile_with(exporter, known_split, 2.0, until=lambda service: len(exporter.kept) >= 2)
    assert len(exporter.kept) >= 2, "reports must keep coming after a downstream bug"
    assert service.telemetry.sample("otelcol_receiver_failed_profile_samples_total", {"receiver": "profiling"}) > 0
