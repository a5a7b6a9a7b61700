"""An OTLP/gRPC profiles backend inside the bench: it accepts every Export, counts the samples,
and keeps the request bytes as they arrived (for truth and size figures)."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2

from pycollector.pdata.serialized import read

SERVICE = profiles_service_pb2.DESCRIPTOR.services_by_name["ProfilesService"].full_name
# A batch of merged reports can exceed gRPC's default 4 MiB.
MAX_MESSAGE_BYTES = 256 << 20


class ProfilesSink:
    """Use as a context manager; ``endpoint`` is what an otlp_grpc exporter dials."""

    def __init__(self, keep_requests: bool) -> None:
        self.keep_requests = keep_requests
        self._changed = threading.Condition()
        self._requests: list[bytes] = []
        self._samples = 0
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.so_reuseport", 0)]
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="bench-sink"), options=options)
        handler = grpc.unary_unary_rpc_method_handler(self._export, response_serializer=profiles_service_pb2.ExportProfilesServiceResponse.SerializeToString)
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {"Export": handler})])
        self.endpoint = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"

    def __enter__(self) -> "ProfilesSink":
        self._server.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.stop(0).wait()

    def _export(self, request: bytes, context) -> profiles_service_pb2.ExportProfilesServiceResponse:
        # An ExportProfilesServiceRequest has the fields, and so the wire form, of ProfilesData;
        # counted by the C extension's walk (a parse would cost the bench's host a core's tenth).
        samples = read(request).samples
        with self._changed:
            self._samples += samples
            if self.keep_requests:
                self._requests.append(request)
            self._changed.notify_all()
        return profiles_service_pb2.ExportProfilesServiceResponse()

    @property
    def samples(self) -> int:
        with self._changed:
            return self._samples

    def wait_for_samples(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._samples < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return True

    def take(self) -> list[bytes]:
        """The requests received since the last take (when kept), and the count starts over."""
        with self._changed:
            requests, self._requests, self._samples = self._requests, [], 0
            return requests
