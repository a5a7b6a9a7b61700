"""``google.rpc.Status`` with ``RetryInfo``: how an OTLP server says "come back in N seconds".

gRPC carries the status in the ``grpc-status-details-bin`` trailer (what grpcio-status would do,
without needing it); OTLP/HTTP puts it in the body of an error response.
"""

from __future__ import annotations

from typing import Iterable

from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

DETAILS_TRAILER = "grpc-status-details-bin"


def status_message(code: int, message: str, retry_after: float | None = None) -> status_pb2.Status:
    """A Status of ``code`` (a gRPC code number), with RetryInfo when a delay is known."""
    status = status_pb2.Status(code=code, message=message)
    if retry_after is not None:
        info = error_details_pb2.RetryInfo()
        info.retry_delay.FromNanoseconds(int(retry_after * 1e9))
        status.details.add().Pack(info)
    return status


def retry_delay(status: status_pb2.Status) -> float | None:
    """The RetryInfo delay in seconds, or None when the status carries none."""
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return info.retry_delay.ToNanoseconds() / 1e9
    return None


def status_from_trailers(trailers: Iterable[tuple[str, bytes]] | None) -> status_pb2.Status | None:
    """The Status a gRPC server attached to an error, or None (then only its code and text exist)."""
    for key, value in trailers or ():
        if key == DETAILS_TRAILER:
            try:
                return status_pb2.Status.FromString(value)
            except DecodeError:
                return None
    return None
