"""The OTLP wire protocol, shared by the otlp receiver and the otlp_grpc / otlp_http exporters:
per signal its messages, gRPC method and HTTP path; the HTTP body encodings (protobuf, OTLP/JSON);
google.rpc.Status with RetryInfo."""

from pycollector.otlp.encodings import ENCODINGS, Encoding, encoding_of
from pycollector.otlp.rpc_status import retry_delay, status_from_trailers, status_message
from pycollector.otlp.signals import OTLP_SIGNALS, OtlpSignal, rejected_count

__all__ = [
    "ENCODINGS",
    "OTLP_SIGNALS",
    "Encoding",
    "OtlpSignal",
    "encoding_of",
    "rejected_count",
    "retry_delay",
    "status_from_trailers",
    "status_message",
]
