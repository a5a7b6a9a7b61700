"""Per signal: the messages, gRPC method and HTTP path of its OTLP Export service.

An ``Export*ServiceRequest`` has the same fields, numbers and JSON names as the ``*Data`` message
of its signal, so a request decodes straight into the ``*Data`` that pipelines carry, and a
``*Data`` encodes as the request: neither side converts.
"""

from __future__ import annotations

import dataclasses

from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.profiles.v1development import profiles_pb2
from opentelemetry.proto.trace.v1 import trace_pb2


@dataclasses.dataclass(frozen=True)
class OtlpSignal:
    signal: str
    data_type: type[Message]  # what flows through pipelines; wire-identical to the request
    response_type: type[Message]
    service: str  # full gRPC service name
    http_path: str  # default URL path of OTLP/HTTP
    rejected_field: str  # in the response's partial_success: how many items the server rejected

    @property
    def grpc_method(self) -> str:
        return f"/{self.service}/Export"


def _service(module, name: str) -> str:
    return module.DESCRIPTOR.services_by_name[name].full_name


OTLP_SIGNALS = {
    "profiles": OtlpSignal(
        "profiles",
        profiles_pb2.ProfilesData,
        profiles_service_pb2.ExportProfilesServiceResponse,
        _service(profiles_service_pb2, "ProfilesService"),
        "/v1development/profiles",
        "rejected_profiles",
    ),
    "traces": OtlpSignal(
        "traces",
        trace_pb2.TracesData,
        trace_service_pb2.ExportTraceServiceResponse,
        _service(trace_service_pb2, "TraceService"),
        "/v1/traces",
        "rejected_spans",
    ),
    "metrics": OtlpSignal(
        "metrics",
        metrics_pb2.MetricsData,
        metrics_service_pb2.ExportMetricsServiceResponse,
        _service(metrics_service_pb2, "MetricsService"),
        "/v1/metrics",
        "rejected_data_points",
    ),
    "logs": OtlpSignal(
        "logs",
        logs_pb2.LogsData,
        logs_service_pb2.ExportLogsServiceResponse,
        _service(logs_service_pb2, "LogsService"),
        "/v1/logs",
        "rejected_log_records",
    ),
}


def rejected_count(signal: str, response: Message) -> tuple[int, str]:
    """(items rejected, the server's message) from a response's partial_success; (0, "") if none."""
    partial = response.partial_success
    return getattr(partial, OTLP_SIGNALS[signal].rejected_field), partial.error_message
