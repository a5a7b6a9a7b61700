"""The pieces behind the otlp components, each on its own: backoff, queue, failure log, sender,
Retry-After, OTLP/JSON, and the configs (Go keys, defaults, validation paths)."""

from __future__ import annotations

import threading
import time
from email.utils import formatdate
from pathlib import Path

import pytest
from opentelemetry.proto.trace.v1 import trace_pb2

from exporters.otlp_grpc.factory import factory as grpc_factory
from exporters.otlp_http.factory import factory as http_factory
from exporters.otlp_http.retry_after import parse_retry_after
from pycollector.component import PermanentError, RefusedError
from pycollector.config import ConfigError, load
from pycollector.config.validate import build_plan
from pycollector.exporterhelper import QueuedRetryExporter, QueueSettings, RetrySettings, RetryableSendError
from pycollector.exporterhelper.backoff import ExponentialBackoff
from pycollector.exporterhelper.bounded_queue import BoundedQueue
from pycollector.exporterhelper.failure_log import FailureLog
from pycollector.otlp.json_codec import from_json, to_json
from pycollector.registry import Registry
from pycollector.telemetry import Telemetry
from pycollector.testing import make_settings, sample_data

TESTDATA = Path(__file__).parent / "testdata" / "otlp"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_backoff_grows_by_the_multiplier_up_to_max_interval_and_gives_up_after_max_elapsed_time():
    clock = FakeClock()
    settings = RetrySettings(initial_interval="1s", randomization_factor=0, multiplier=2, max_interval="5s", max_elapsed_time="20s")
    backoff = ExponentialBackoff(settings, clock=clock)
    delays = []
    while (delay := backoff.next_delay()) is not None:
        delays.append(delay)
        clock.now += delay
    assert delays == [1, 2, 4, 5, 5]  # a sixth wait would end past 20 s


def test_backoff_randomizes_within_the_factor():
    settings = RetrySettings(initial_interval="10s", randomization_factor=0.5)
    delays = [ExponentialBackoff(settings).next_delay() for _ in range(200)]
    assert 5 <= min(delays) < 6 and 14 < max(delays) <= 15


def test_retry_and_queue_settings_are_validated_like_go():
    with pytest.raises(ValueError, match="'max_elapsed_time' must not be less than 'max_interval'"):
        RetrySettings(max_interval="1m", max_elapsed_time="30s")
    assert RetrySettings(max_elapsed_time=0).max_elapsed_time == 0  # 0: retry forever
    assert RetrySettings(enabled=False, max_interval="1m", max_elapsed_time="30s")  # off: nothing to check
    with pytest.raises(ValueError):
        QueueSettings(num_consumers=0)
    defaults = (RetrySettings(), QueueSettings())
    assert defaults[0].model_dump(mode="json") == {"enabled": True, "initial_interval": "5s", "randomization_factor": 0.5, "multiplier": 1.5, "max_interval": "30s", "max_elapsed_time": "5m"}
    assert defaults[1].model_dump() == {"enabled": True, "num_consumers": 10, "queue_size": 1000, "block_on_overflow": False, "sizer": "requests", "storage": None}


def test_bounded_queue_refuses_when_full_and_drains_in_order_after_close():
    queue = BoundedQueue(2)
    assert queue.offer(1) and queue.offer(2) and not queue.offer(3)
    waiting = threading.Thread(target=queue.put, args=(3,))
    waiting.start()
    time.sleep(0.05)
    assert waiting.is_alive()  # put waits for room
    assert queue.take() == 1
    waiting.join(1)
    queue.close()
    assert not queue.offer(4)
    assert [queue.take(), queue.take(), queue.take()] == [2, 3, None]


class Logged:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict]] = []

    def __getattr__(self, level):
        return lambda event, **fields: self.lines.append((level, event, fields))


def test_failure_log_says_the_first_failure_at_once_and_sums_up_the_rest_per_interval():
    logger, clock = Logged(), FakeClock()
    failures = FailureLog(logger, interval=10, clock=clock)
    for _ in range(50):
        failures.record("error", "dropping", 3, error="HTTP 400")
        clock.now += 0.1
    assert logger.lines == [("error", "dropping", {"requests": 1, "items": 3, "error": "HTTP 400"})]
    clock.now += 10
    failures.record("error", "dropping", 3, error="HTTP 400")
    assert logger.lines[-1] == ("error", "dropping", {"requests": 50, "items": 150, "error": "HTTP 400"})
    failures.record("error", "dropping", 2, error="HTTP 413")
    failures.flush()
    assert logger.lines[-1] == ("error", "dropping", {"requests": 1, "items": 2, "error": "HTTP 413"})
    failures.flush()
    assert len(logger.lines) == 3  # nothing new, nothing said


def sender_with(send, **queue):
    telemetry = Telemetry()
    settings = make_settings("exporters", "helper", telemetry)
    retry = RetrySettings(initial_interval="10ms", randomization_factor=0, max_interval="10ms", max_elapsed_time="200ms")
    return QueuedRetryExporter(settings, retry, QueueSettings(**queue), send), telemetry


def test_sender_retries_until_the_backend_takes_it_and_counts_once():
    attempts = []

    def send(data):
        attempts.append(data)
        if len(attempts) < 3:
            raise RetryableSendError("not yet")

    sender, telemetry = sender_with(send, num_consumers=1)
    sender.start()
    sender.consume(sample_data("logs"))
    deadline = time.monotonic() + 5
    while telemetry.sample("otelcol_exporter_sent_log_records_total", {"exporter": "helper"}) != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    sender.shutdown()
    assert len(attempts) == 3
    assert telemetry.sample("otelcol_exporter_sent_log_records_total", {"exporter": "helper"}) == 1
    assert telemetry.sample("otelcol_exporter_send_failed_log_records_total", {"exporter": "helper"}) is None


def test_sender_without_a_queue_raises_what_finally_failed():
    def send(data):
        raise RetryableSendError("down", retry_after=None) if signal_is_traces(data) else PermanentError("bad")

    def signal_is_traces(data):
        return isinstance(data, trace_pb2.TracesData)

    sender, telemetry = sender_with(send, enabled=False)
    with pytest.raises(RefusedError, match="no more retries left"):
        sender.consume(sample_data("traces"))
    with pytest.raises(PermanentError, match="bad"):
        sender.consume(sample_data("logs"))
    assert telemetry.sample("otelcol_exporter_send_failed_spans_total", {"exporter": "helper"}) == 1


def test_sender_with_block_on_overflow_waits_for_room_and_refuses_after_shutdown():
    release = threading.Event()
    sender, telemetry = sender_with(lambda data: release.wait(), num_consumers=1, queue_size=1, block_on_overflow=True)
    sender.start()
    sender.consume(sample_data("logs"))  # taken by the consumer, which blocks
    time.sleep(0.05)
    sender.consume(sample_data("logs"))  # fills the queue
    blocked = threading.Thread(target=sender.consume, args=(sample_data("logs"),))
    blocked.start()
    time.sleep(0.1)
    assert blocked.is_alive()
    release.set()
    blocked.join(2)
    assert not blocked.is_alive()
    sender.shutdown()
    assert telemetry.sample("otelcol_exporter_sent_log_records_total", {"exporter": "helper"}) == 3
    with pytest.raises(RefusedError, match="shutting down"):
        sender.consume(sample_data("logs"))
    assert telemetry.sample("otelcol_exporter_enqueue_failed_log_records_total", {"exporter": "helper"}) == 1


def test_retry_after_is_seconds_or_an_http_date():
    now = 1_000_000_000.0
    assert parse_retry_after("7", now) == 7
    assert parse_retry_after(formatdate(now + 30, usegmt=True), now) == 30
    assert parse_retry_after(formatdate(now - 30, usegmt=True), now) == 0
    assert parse_retry_after("soon", now) is None and parse_retry_after(None, now) is None


def test_otlp_json_writes_ids_as_hex_and_reads_them_back():
    data = sample_data("traces")
    text = to_json(data)
    assert b'"traceId":"01010101010101010101010101010101"' in text and b'"spanId":"0202020202020202"' in text
    assert from_json(text, trace_pb2.TracesData) == data
    with pytest.raises(ValueError, match="not hex"):
        from_json(b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"xyz"}]}]}]}', trace_pb2.TracesData)
    with pytest.raises(ValueError):
        from_json(b"[1, 2]", trace_pb2.TracesData)


def test_otlp_http_urls_per_signal_like_go():
    config = http_factory.config_model.model_validate({"endpoint": "https://gateway:4318/base/", "traces_endpoint": "https://traces.example.com/in"})
    assert config.signal_url("profiles") == "https://gateway:4318/base/v1development/profiles"
    assert config.signal_url("metrics") == "https://gateway:4318/base/v1/metrics"
    assert config.signal_url("traces") == "https://traces.example.com/in"
    assert (config.timeout, config.compression, config.encoding) == (30.0, "gzip", "proto")


def test_otlp_grpc_uses_tls_unless_insecure_as_go():
    model = grpc_factory.config_model
    assert model.model_validate({}).uses_tls() and model.model_validate({}).timeout == 5.0
    assert not model.model_validate({"tls": {"insecure": True}}).uses_tls()
    assert model.model_validate({"endpoint": "https://backend:443", "tls": {"insecure": True}}).uses_tls()
    assert model.model_validate({"endpoint": "http://backend:4317"}).target() == "backend:4317"
    with pytest.raises(ValueError, match="'cert_file' and 'key_file' are set together"):
        model.model_validate({"tls": {"cert_file": "client.crt"}})
    assert grpc_factory.aliases == ("otlp",) and http_factory.aliases == ("otlphttp",)


def test_a_go_gateway_config_is_valid_and_every_mistake_is_named_by_its_path():
    plan = build_plan(load([str(TESTDATA / "go_gateway.yaml")], env={}), Registry())
    assert plan.component("exporters", "otlp").factory is grpc_factory
    assert plan.component("receivers", "otlp").config.protocols.http.url_paths()["traces"] == "/ingest/traces"
    with pytest.raises(ConfigError) as error:
        build_plan(load([str(TESTDATA / "mistakes.yaml")], env={}), Registry())
    assert sorted(problem.split(": ", 1)[0] for problem in error.value.problems) == sorted(
        [
            "receivers::otlp::protocols::grpc::endpoint",
            "receivers::otlp::protocols::htp",
            "exporters::otlp_grpc::compression",
            "exporters::otlp_grpc::retry_on_failure",
            "exporters::otlp_grpc::sending_queue::queue_size",
            "exporters::otlp_http::endpoint",
            "exporters::otlp_http::encoding",
        ]
    )
    # A Go config's zstd is told why it fails, not only what would work.
    assert "exporters::otlp_grpc::compression: 'zstd' is not available for gRPC in Python" in "\n".join(error.value.problems)
