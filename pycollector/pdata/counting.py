"""Which signal a message is, and how many items it carries.

The engine routes each message by signal and counts accepted/refused items per component, as the
Go collector's ``otelcol_*_sent_<items>`` metrics do. Receivers may hand over either the ``*Data``
message or the OTLP ``Export*ServiceRequest`` (the same fields), so both are recognised.
"""

from __future__ import annotations

from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.profiles.v1development import profiles_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from pycollector.pdata.serialized import SerializedProfiles

# The item each signal counts, named as in the Go collector's telemetry.
ITEM_NAMES = {
    "profiles": "profile_samples",
    "traces": "spans",
    "metrics": "metric_points",
    "logs": "log_records",
}

# The repeated field that holds each signal's per-resource entries.
RESOURCE_FIELDS = {
    "profiles": "resource_profiles",
    "traces": "resource_spans",
    "metrics": "resource_metrics",
    "logs": "resource_logs",
}

_SIGNALS: dict[type, str] = {
    profiles_pb2.ProfilesData: "profiles",
    profiles_service_pb2.ExportProfilesServiceRequest: "profiles",
    SerializedProfiles: "profiles",
    trace_pb2.TracesData: "traces",
    trace_service_pb2.ExportTraceServiceRequest: "traces",
    metrics_pb2.MetricsData: "metrics",
    metrics_service_pb2.ExportMetricsServiceRequest: "metrics",
    logs_pb2.LogsData: "logs",
    logs_service_pb2.ExportLogsServiceRequest: "logs",
}


def message_types() -> dict[str, type]:
    """The pipelines' message classes by their full protobuf name (for data read back from disk)."""
    return {message_type.DESCRIPTOR.full_name: message_type for message_type in _SIGNALS if message_type is not SerializedProfiles}


def resource_entries(message: Message):
    """The message's per-resource entries (``resource_profiles``, ``resource_spans``...)."""
    return getattr(message, RESOURCE_FIELDS[signal_of(message)])


def signal_of(message: Message) -> str:
    """ "profiles", "traces", "metrics" or "logs"; TypeError for any other message."""
    try:
        return _SIGNALS[type(message)]
    except KeyError:
        raise TypeError(
            f"{type(message).__name__} is not a profiles, traces, metrics or logs message"
        ) from None


def sample_count(data: profiles_pb2.ProfilesData | SerializedProfiles) -> int:
    """Number of ``Sample`` messages (not the sum of their values)."""
    if isinstance(data, SerializedProfiles):
        return data.samples
    return sum(
        len(profile.samples)
        for resource_profiles in data.resource_profiles
        for scope_profiles in resource_profiles.scope_profiles
        for profile in scope_profiles.profiles
    )


def _span_count(data: trace_pb2.TracesData) -> int:
    return sum(
        len(scope.spans) for resource in data.resource_spans for scope in resource.scope_spans
    )


def _metric_point_count(data: metrics_pb2.MetricsData) -> int:
    count = 0
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                kind = metric.WhichOneof(
                    "data"
                )  # gauge, sum, histogram, exponential_histogram, summary
                if kind is not None:
                    count += len(getattr(metric, kind).data_points)
    return count


def _log_record_count(data: logs_pb2.LogsData) -> int:
    return sum(
        len(scope.log_records) for resource in data.resource_logs for scope in resource.scope_logs
    )


_COUNTERS = {
    "profiles": sample_count,
    "traces": _span_count,
    "metrics": _metric_point_count,
    "logs": _log_record_count,
}


def item_count(message: Message) -> int:
    """Items as ``ITEM_NAMES`` names them: samples, spans, data points or log records."""
    return _COUNTERS[signal_of(message)](message)
