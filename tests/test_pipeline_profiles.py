"""Whole profiles pipelines over real receivers: batch fed by the eBPF profiling receiver and by
OTLP, and memory_limiter backpressure as a real OTLP client sees it (HTTP 503, gRPC UNAVAILABLE)."""

import subprocess
import time

import grpc
import pytest
import requests

from pycollector.config.validate import build_plan
from pycollector.pdata import sample_count
from pycollector.service import Service
from pycollector.testing import CapturingExporterFactory, registry_with
from processors.memory_limiter import memory

from tests.conftest import WORKLOADS
from tests.test_otlp_support import a_profile, component, export_grpc
from tests.test_processors_memory_limiter import HEADROOM_MIB, MIB, SPIKE_MIB, SlowBackendFactory, big_profile


@pytest.mark.bpf
def test_batch_turns_many_receiver_pushes_into_fewer_larger_exports(tmp_path):
    capture = CapturingExporterFactory()
    config = {
        "receivers": {
            "profiling": {"samples_per_second": 97, "reporter_interval": "200ms", "reporter_jitter": 0},
            "otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}},
        },
        "processors": {"batch": {"timeout": "1s", "send_batch_size": 100_000}},
        "exporters": {"capture": {}},
        "service": {
            "telemetry": {"metrics": {"level": "none"}},
            "pipelines": {"profiles": {"receivers": ["profiling", "otlp"], "processors": ["batch"], "exporters": ["capture"]}},
        },
    }
    service = Service(build_plan(config, registry_with(exporters={"capture": capture})))
    service.start()
    binary = tmp_path / "known_split"
    subprocess.run(["gcc", "-O2", "-fno-omit-frame-pointer", "-o", str(binary), str(WORKLOADS / "known_split.c")], check=True)
    try:
        workload = subprocess.Popen([str(binary), "2.5"], stdout=subprocess.DEVNULL)
        host, port = component(service, "receivers", "otlp").grpc_address
        for _ in range(5):
            assert export_grpc(f"{host}:{port}", a_profile(samples=4)) == grpc.StatusCode.OK
            time.sleep(0.3)
        workload.wait(timeout=30)
    finally:
        service.shutdown()
    sample = service.telemetry.sample
    accepted = sample("otelcol_receiver_accepted_profile_samples_total", {"receiver": "profiling"}) + sample("otelcol_receiver_accepted_profile_samples_total", {"receiver": "otlp"})
    pushes = sample("pycollector_profiling_bpf_events_total", {"receiver": "profiling", "event": "intervals"}) + 5
    exported = sum(sample_count(message) for message in capture.consumer.messages)
    print(f"\n{pushes:.0f} receiver pushes -> {len(capture.consumer.messages)} exports; {accepted:.0f} samples in, {exported} out")
    assert exported == accepted  # nothing lost, nothing duplicated
    assert 1 <= len(capture.consumer.messages) < pushes, "batch should send fewer, larger messages"
    labels = {"processor": "batch"}
    assert sample("otelcol_processor_batch_timeout_trigger_send_total", labels) >= 1
    assert (sample("otelcol_processor_batch_batch_size_trigger_send_total", labels) or 0) == 0
    assert sample("otelcol_processor_batch_batch_send_size_sum", labels) == exported


def test_memory_limiter_backpressure_reaches_real_otlp_clients():
    memory.collect_garbage()
    limit_mib = memory.resident_bytes() // MIB + HEADROOM_MIB
    backend = SlowBackendFactory()
    config = {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0", "max_recv_msg_size_mib": 16}, "http": {"endpoint": "127.0.0.1:0"}}}},
        "processors": {"memory_limiter": {"check_interval": "20ms", "limit_mib": limit_mib, "spike_limit_mib": SPIKE_MIB}},
        "exporters": {"slow_backend": {}},
        "service": {
            "telemetry": {"metrics": {"level": "none"}},
            "pipelines": {"profiles": {"receivers": ["otlp"], "processors": ["memory_limiter"], "exporters": ["slow_backend"]}},
        },
    }
    service = Service(build_plan(config, registry_with(exporters={"slow_backend": backend})))
    service.start()
    receiver = component(service, "receivers", "otlp")
    http_url = "http://%s:%d/v1development/profiles" % receiver.http_address
    grpc_endpoint = "%s:%d" % receiver.grpc_address
    # The backend holds everything until the first refusal, so memory reaches the limit however
    # slowly a loaded host lets the client send; then it drains, and memory falls again.
    backend.backend.draining.clear()
    try:
        http_statuses, retry_after = send_until_refused_then_accepted(
            lambda body: requests.post(http_url, data=body, headers={"Content-Type": "application/x-protobuf"}, timeout=10),
            lambda response: response.status_code, 503, 200, on_refused=backend.backend.draining.set,
        )
        backend.backend.draining.clear()
        grpc_codes, _ = send_until_refused_then_accepted(
            lambda body: export_grpc(grpc_endpoint, big_profile(0)), lambda code: code, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.OK,
            on_refused=backend.backend.draining.set,
        )
    finally:
        service.shutdown()
    assert 503 in http_statuses and http_statuses[-1] == 200 and retry_after
    assert grpc.StatusCode.UNAVAILABLE in grpc_codes and grpc_codes[-1] == grpc.StatusCode.OK
    refused = service.telemetry.sample("otelcol_receiver_refused_profile_samples_total", {"receiver": "otlp"})
    assert refused == http_statuses.count(503) + grpc_codes.count(grpc.StatusCode.UNAVAILABLE)


def send_until_refused_then_accepted(send, outcome_of, refused, accepted, on_refused, seconds=20.0):
    """Send ~1 MiB profiles as fast as possible until one is refused and a later one accepted;
    ``on_refused`` runs at each refusal."""
    outcomes, retry_after, began = [], None, time.monotonic()
    body = big_profile(0).SerializeToString()
    while time.monotonic() - began < seconds:
        result = send(body)
        outcomes.append(outcome_of(result))
        if outcomes[-1] == refused:
            on_refused()
            if hasattr(result, "headers"):
                retry_after = result.headers.get("Retry-After")
        if refused in outcomes and outcomes[-1] == accepted:
            break
        if outcomes[-1] == refused:
            time.sleep(0.02)
    return outcomes, retry_after
