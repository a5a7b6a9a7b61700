"""The official OpenTelemetry Python SDK's OTLP exporters (a client nobody here wrote) send traces,
metrics and logs to the otlp receiver, over gRPC and over HTTP, and they arrive intact."""

from __future__ import annotations

import pytest
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.logs.v1.logs_pb2 import LogsData
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from pycollector.pdata import to_dict
from pycollector.testing import CapturingConsumer, TestHost, make_settings
from receivers.otlp.factory import factory

RESOURCE = Resource.create({"service.name": "sdk-client", "deployment.environment": "test"})


@pytest.fixture(scope="module")
def receiver():
    config = factory.config_model.model_validate({"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}}})
    consumer = CapturingConsumer()
    receiver = factory.create(make_settings("receivers", "otlp"), config, consumer)
    receiver.start(TestHost())
    receiver.consumer = consumer
    yield receiver
    receiver.shutdown()


def exporters(receiver, transport: str) -> dict:
    if transport == "grpc":
        endpoint = "{}:{}".format(*receiver.grpc_address)
        return {
            "traces": GrpcSpanExporter(endpoint=endpoint, insecure=True, timeout=5),
            "metrics": GrpcMetricExporter(endpoint=endpoint, insecure=True, timeout=5),
            "logs": GrpcLogExporter(endpoint=endpoint, insecure=True, timeout=5),
        }
    base = "http://{}:{}".format(*receiver.http_address)
    return {
        "traces": HttpSpanExporter(endpoint=f"{base}/v1/traces", compression=Compression.Gzip, timeout=5),
        "metrics": HttpMetricExporter(endpoint=f"{base}/v1/metrics", timeout=5),
        "logs": HttpLogExporter(endpoint=f"{base}/v1/logs", compression=Compression.Deflate, timeout=5),
    }


def received(receiver, kind: type) -> list:
    return [message for message in receiver.consumer.messages if isinstance(message, kind)]


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_sdk_traces_metrics_and_logs_arrive_intact(receiver, transport):
    receiver.consumer.messages.clear()
    sdk = exporters(receiver, transport)

    tracer_provider = TracerProvider(resource=RESOURCE)
    tracer_provider.add_span_processor(SimpleSpanProcessor(sdk["traces"]))
    tracer = tracer_provider.get_tracer("sdk-test")
    with tracer.start_as_current_span("parent", attributes={"http.method": "GET", "retries": 3}) as parent:
        with tracer.start_as_current_span("child") as child:
            child.add_event("cache miss", {"key": "k1"})
    tracer_provider.shutdown()

    meter_provider = MeterProvider(resource=RESOURCE, metric_readers=[PeriodicExportingMetricReader(sdk["metrics"], export_interval_millis=3_600_000)])
    meter_provider.get_meter("sdk-test").create_counter("requests").add(5, {"route": "/a"})
    meter_provider.force_flush()
    meter_provider.shutdown()

    logger_provider = LoggerProvider(resource=RESOURCE)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(sdk["logs"]))
    logger_provider.get_logger("sdk-test").emit(body="disk almost full", severity_number=SeverityNumber.WARN, attributes={"disk": "/dev/sda1"})
    logger_provider.shutdown()

    spans = {span.name: span for data in received(receiver, TracesData) for rs in data.resource_spans for ss in rs.scope_spans for span in ss.spans}
    assert set(spans) == {"parent", "child"}
    context = parent.get_span_context()
    assert spans["parent"].trace_id == context.trace_id.to_bytes(16, "big") == spans["child"].trace_id
    assert spans["parent"].span_id == context.span_id.to_bytes(8, "big") == spans["child"].parent_span_id
    assert to_dict(spans["parent"].attributes) == {"http.method": "GET", "retries": 3}
    assert spans["child"].events[0].name == "cache miss" and to_dict(spans["child"].events[0].attributes) == {"key": "k1"}

    metrics = received(receiver, MetricsData)[0].resource_metrics[0]
    assert to_dict(metrics.resource.attributes)["service.name"] == "sdk-client"
    [counter] = [m for sm in metrics.scope_metrics for m in sm.metrics if m.name == "requests"]
    assert counter.sum.data_points[0].as_int == 5 and to_dict(counter.sum.data_points[0].attributes) == {"route": "/a"}

    [logs] = received(receiver, LogsData)
    record = logs.resource_logs[0].scope_logs[0].log_records[0]
    assert (record.body.string_value, record.severity_number, to_dict(record.attributes)) == ("disk almost full", SeverityNumber.WARN.value, {"disk": "/dev/sda1"})
    assert to_dict(logs.resource_logs[0].resource.attributes)["deployment.environment"] == "test"
