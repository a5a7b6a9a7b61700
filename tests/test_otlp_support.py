"""What the otlp tests share (this module holds no tests): backends, a client, services, profiles.

``GrpcBackend`` and ``HttpBackend`` are real servers that answer from a script (each request takes
the next scripted answer, the last one repeating) and, like a CapturingConsumer, keep in
``messages`` what they accepted, decoded into the ``*Data`` message of its signal. ``gate`` holds
requests until set (a slow backend). ``HttpBackend`` reads bodies as the otlp receiver does (gzip,
deflate or zstd) and keeps each request's ``Content-Encoding`` in ``content_encodings``. Both keep
each request's HTTP headers or gRPC metadata in ``request_headers``.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
from urllib.parse import urlsplit
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc

import pycollector.client
from pycollector.config.validate import build_plan
from pycollector.otlp import OTLP_SIGNALS, encoding_of, status_message
from pycollector.otlp.rpc_status import DETAILS_TRAILER
from pycollector.pdata import ProfilesBuilder, iter_samples, signal_of
from pycollector.registry import Registry
from pycollector.service import Service
from pycollector.testing import CapturingConsumer
from receivers.otlp.http_body import read_body


class ClientRecorder(CapturingConsumer):
    """Keeps, for each message, the client the pipeline said sent it (``pycollector.client``)."""

    def __init__(self):
        super().__init__()
        self.clients = []

    def consume(self, data):
        self.clients.append(pycollector.client.current())
        super().consume(data)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclasses.dataclass
class Answer:
    """One scripted answer. gRPC uses ``code`` (None: OK); HTTP uses ``status`` and ``headers``."""

    code: grpc.StatusCode | None = None
    retry_after: float | None = None  # gRPC: sent as RetryInfo
    status: int = 200
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    body: bytes = b""
    rejected: int = 0  # gRPC: a partial success rejecting this many items


class _Recorder(CapturingConsumer):
    """Keeps what it accepted in ``messages`` (``wait_for`` a condition), and when each attempt came."""

    def __init__(self, script: list[Answer] | None):
        super().__init__()
        self.script = list(script or [Answer()])
        self.attempt_times: list[float] = []
        self.request_headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.gate = threading.Event()
        self.gate.set()

    def _arrived(self) -> Answer:
        with self._changed:
            self.attempt_times.append(time.monotonic())
            self.in_flight += 1
            self._changed.notify_all()
            answer = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        self.gate.wait()
        return answer

    def _done(self, data: Any, accepted: bool) -> None:
        with self._changed:
            self.in_flight -= 1
            self._changed.notify_all()
            if accepted:
                self.consume(data)

    def of(self, signal: str) -> list[Any]:
        return [data for data in self.messages if signal_of(data) == signal]

    def retry_wait(self) -> float:
        """Seconds between the first two attempts (at one request, when it was retried)."""
        assert self.wait_for(lambda backend: len(backend.attempt_times) >= 2), "no second attempt"
        return self.attempt_times[1] - self.attempt_times[0]


class GrpcBackend(_Recorder):
    def __init__(self, script: list[Answer] | None = None, port: int = 0):
        super().__init__(script)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=[("grpc.so_reuseport", 0)])
        for otlp in OTLP_SIGNALS.values():
            handler = grpc.unary_unary_rpc_method_handler(self._handler(otlp), request_deserializer=otlp.data_type.FromString, response_serializer=otlp.response_type.SerializeToString)
            self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(otlp.service, {"Export": handler})])
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.endpoint = f"127.0.0.1:{self.port}"

    def _handler(self, otlp):
        def export(data, context):
            self.request_headers.append(dict(context.invocation_metadata()))
            answer = self._arrived()
            self._done(data, answer.code is None)
            if answer.code is not None:
                if answer.retry_after is not None:
                    status = status_message(answer.code.value[0], "scripted", answer.retry_after)
                    context.set_trailing_metadata([(DETAILS_TRAILER, status.SerializeToString())])
                context.abort(answer.code, "scripted failure")
            response = otlp.response_type()
            if answer.rejected:
                setattr(response.partial_success, otlp.rejected_field, answer.rejected)
                response.partial_success.error_message = "scripted partial success"
            return response

        return export

    def __enter__(self) -> "GrpcBackend":
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.gate.set()
        self.server.stop(0).wait()


class HttpBackend(_Recorder):
    def __init__(self, script: list[Answer] | None = None, port: int = 0):
        super().__init__(script)
        self.content_encodings: list[str | None] = []
        self.request_targets: list[str] = []
        recorder = self
        paths = {otlp.http_path: otlp for otlp in OTLP_SIGNALS.values()}

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                otlp = paths[urlsplit(self.path).path]  # (through a proxy, the request names the whole URL)
                recorder.request_targets.append(self.path)
                recorder.content_encodings.append(self.headers["Content-Encoding"])
                recorder.request_headers.append(dict(self.headers.items()))
                body = read_body(self.rfile, self.headers, 1 << 30)
                data = encoding_of(self.headers["Content-Type"]).decode(body, otlp.data_type)
                answer = recorder._arrived()
                recorder._done(data, answer.status < 300)
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "HttpBackend":
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


# -- the collector side ----------------------------------------------------------------------------


def build_service(config: dict) -> Service:
    """An in-process service of the installed plugins, self-metrics readable but not served."""
    config.setdefault("service", {}).setdefault("telemetry", {"metrics": {"level": "none"}})
    return Service(build_plan(config, Registry()))


def component(service: Service, kind: str, name: str) -> Any:
    return next(node.component for node in service.graph.nodes.values() if node.key.kind == kind and node.key.id == name)


def counter(service: Service, name: str, labels: dict[str, str]) -> float:
    """A counter's value; 0 for one never incremented (its series does not exist yet)."""
    return service.telemetry.sample(name, labels) or 0.0


def export_grpc(endpoint: str, data: Any, timeout: float = 10.0, metadata: list[tuple[str, str]] | None = None) -> grpc.StatusCode:
    """Send ``data`` with a plain gRPC client, as another collector would, with ``metadata`` as
    its request metadata; the call's status code."""
    otlp = OTLP_SIGNALS[signal_of(data)]
    with grpc.insecure_channel(endpoint) as channel:
        call = channel.unary_unary(otlp.grpc_method, request_serializer=lambda message: message.SerializeToString(), response_deserializer=otlp.response_type.FromString)
        try:
            call(data, timeout=timeout, metadata=metadata)
        except grpc.RpcError as error:
            return error.code()
    return grpc.StatusCode.OK


def a_profile(samples: int = 3, pid: int = 4242) -> Any:
    """Profiles with distinct stacks, frames, mappings and attributes on every level."""
    builder = ProfilesBuilder()
    mapping = builder.mapping(filename="/usr/bin/app", memory_start=0x1000, memory_limit=0x9000, attributes={"process.executable.build_id.gnu": "abc123"})
    main = builder.location(mapping_index=mapping, address=0x1100, lines=[(builder.function("main", filename="main.c"), 10, 0)], attributes={"profile.frame.type": "native"})
    resource = builder.resource_profiles({"process.pid": pid, "process.executable.name": "app", "host.name": "node-1"})
    profile = builder.profile(builder.scope_profiles(resource, name="pycollector-test"), period=50_000_000, profile_id=bytes(range(16)))
    for index in range(samples):
        leaf = builder.location(mapping_index=mapping, address=0x2000 + index, lines=[(builder.function(f"work_{index}", filename="work.c"), 20 + index, 0)], attributes={"profile.frame.type": "native"})
        builder.sample(profile, builder.stack([leaf, main]), [index + 1], attributes={"thread.id": pid + index, "thread.name": f"worker-{index}"})
    return builder.data


def sample_tuples(data: Any) -> list[tuple]:
    """Every sample of ``data`` with what it resolves to: comparable across encodings and hops."""
    return [(view.resource, view.scope_name, view.frames, view.attributes, view.values) for view in iter_samples(data)]
