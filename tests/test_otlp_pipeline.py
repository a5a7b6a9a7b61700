"""Real pycollector processes (the installed console script) passing data over OTLP hops.

client --gRPC--> agent --HTTP (JSON, gzip)--> gateway --gRPC--> sink (a capturing server here)
(the ``collectors`` fixture, in conftest, runs them)
"""

from __future__ import annotations

import time
import urllib.request

import grpc

from pycollector.testing import sample_data

from tests.test_otlp_support import Answer, GrpcBackend, a_profile, export_grpc, free_port, sample_tuples


def pipelines(receiver: str, exporter: str) -> dict:
    return {signal: {"receivers": [receiver], "exporters": [exporter]} for signal in ("profiles", "traces")}


def scrape(port: int, series: str) -> float | None:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series + " ")]
    return values[0] if values else None


def wait_for_series(port: int, series: str, expected: float, timeout: float = 10.0) -> float | None:
    deadline = time.monotonic() + timeout
    while (value := scrape(port, series)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def test_agent_to_gateway_to_sink_keeps_every_sample_frame_and_attribute(collectors):
    agent_grpc, agent_metrics, gateway_http, gateway_metrics = (free_port() for _ in range(4))
    fast_retry = {"initial_interval": "100ms", "max_interval": "1s", "max_elapsed_time": "30s"}
    with GrpcBackend() as sink:
        gateway = collectors(
            "gateway",
            {
                "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{gateway_http}"}}}},
                "exporters": {"otlp_grpc/sink": {"endpoint": sink.endpoint, "tls": {"insecure": True}, "retry_on_failure": fast_retry}},
                "service": {"telemetry": {"metrics": {"address": f"127.0.0.1:{gateway_metrics}"}}, "pipelines": pipelines("otlp", "otlp_grpc/sink")},
            },
        )
        agent = collectors(
            "agent",
            {
                "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{agent_grpc}"}}}},
                "exporters": {"otlphttp": {"endpoint": f"http://127.0.0.1:{gateway_http}", "encoding": "json", "retry_on_failure": fast_retry}},
                "service": {"telemetry": {"metrics": {"address": f"127.0.0.1:{agent_metrics}"}}, "pipelines": pipelines("otlp", "otlphttp")},
            },
        )
        gateway.wait_listening(gateway_http)
        agent.wait_listening(agent_grpc)

        profile, spans = a_profile(samples=5), sample_data("traces")
        assert export_grpc(f"127.0.0.1:{agent_grpc}", profile) == grpc.StatusCode.OK
        assert export_grpc(f"127.0.0.1:{agent_grpc}", spans) == grpc.StatusCode.OK
        assert sink.wait_for(lambda s: len(s.messages) == 2, timeout=15), f"agent:\n{agent.log()}\ngateway:\n{gateway.log()}"

        [received] = sink.of("profiles")
        assert sample_tuples(received) == sample_tuples(profile)
        assert received == profile  # nothing lost or added on the way, the dictionary included
        assert sink.of("traces") == [spans]

        assert wait_for_series(agent_metrics, 'otelcol_exporter_sent_profile_samples_total{exporter="otlphttp"}', 5) == 5
        assert wait_for_series(gateway_metrics, 'otelcol_receiver_accepted_profile_samples_total{receiver="otlp"}', 5) == 5
        assert wait_for_series(gateway_metrics, 'otelcol_exporter_sent_profile_samples_total{exporter="otlp_grpc/sink"}', 5) == 5
        assert scrape(gateway_metrics, 'otelcol_exporter_send_failed_profile_samples_total{exporter="otlp_grpc/sink"}') is None

        for collector in (agent, gateway):
            code, _ = collector.stop()
            assert code == 0, collector.log()


def test_ctrl_c_during_a_long_backoff_exits_cleanly_without_waiting_it_out(collectors):
    receiver_port = free_port()
    with GrpcBackend([Answer(code=grpc.StatusCode.UNAVAILABLE)]) as backend:
        agent = collectors(
            "agent",
            {
                "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{receiver_port}"}}}},
                # `otlp` is the deprecated name of otlp_grpc: it still works, and says so once.
                "exporters": {"otlp": {"endpoint": backend.endpoint, "tls": {"insecure": True}, "retry_on_failure": {"initial_interval": "60s", "max_interval": "60s"}}},
                "service": {"telemetry": {"metrics": {"level": "none"}}, "pipelines": {"profiles": {"receivers": ["otlp"], "exporters": ["otlp"]}}},
            },
        )
        agent.wait_listening(receiver_port)
        assert export_grpc(f"127.0.0.1:{receiver_port}", a_profile()) == grpc.StatusCode.OK
        assert backend.wait_for(lambda b: len(b.attempt_times) == 1)
        time.sleep(0.3)  # in a backoff of about a minute now
        code, took = agent.stop()
    print(f"Ctrl-C during a 60s backoff: exited with {code} after {took:.3f}s")
    log = agent.log()
    # (The backoff lasts a minute; the exit takes half a second at rest, 1.1 s with CI's three
    # workers on two cores: a bound of a second was a timing, not this check.)
    assert code == 0 and took < 15.0, log
    assert "exporting failed; dropping data" in log and "the exporter is shutting down" in log
    assert sum("deprecated" in line for line in log.splitlines()) == 1
