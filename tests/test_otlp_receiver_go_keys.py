"""The otlp receiver's keys from Go's server configs (issue 28), on real servers: Unix sockets for
both protocols, CORS, response headers, the compression algorithms taken, keep-alives off,
sections switched off with `enabled: false`, inline PEM certificates, and gRPC keepalive."""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess

import grpc
import pytest

from pycollector.config.servers import KeepaliveServer, grpc_keepalive_options
from pycollector.testing import sample_data
from receivers.otlp.factory import factory

from tests.test_otlp_receiver import started  # noqa: F401 (the fixture: a receiver started on the given protocols)
from tests.test_otlp_support import export_grpc

PROTOBUF = {"Content-Type": "application/x-protobuf"}


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str):
        super().__init__("localhost")
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self._path)


def test_both_protocols_listen_on_unix_sockets(started, tmp_path):
    grpc_path, http_path = str(tmp_path / "otlp-grpc.sock"), str(tmp_path / "otlp-http.sock")
    receiver, consumer = started(protocols={"grpc": {"transport": "unix", "endpoint": grpc_path}, "http": {"transport": "unix", "endpoint": http_path}})
    data = sample_data("traces")
    assert export_grpc(f"unix:{grpc_path}", data) == grpc.StatusCode.OK
    connection = UnixConnection(http_path)
    connection.request("POST", "/v1/traces", body=data.SerializeToString(), headers=PROTOBUF)
    assert connection.getresponse().status == 200
    assert consumer.messages == [data, data]


def test_a_stale_socket_file_is_replaced_and_a_regular_file_is_not(started, tmp_path):
    stale = tmp_path / "stale.sock"
    leftover = socket.socket(socket.AF_UNIX)
    leftover.bind(str(stale))
    leftover.close()  # (the file stays: a collector that was killed)
    started(protocols={"http": {"transport": "unix", "endpoint": str(stale)}})
    regular = tmp_path / "notes.txt"
    regular.write_text("mine")
    with pytest.raises(Exception, match="cannot listen"):
        started(protocols={"http": {"transport": "unix", "endpoint": str(regular)}})
    assert regular.read_text() == "mine"


def _http(receiver, method: str, path: str, headers: dict, body: bytes = b"") -> http.client.HTTPResponse:
    host, port = receiver.http_address
    connection = http.client.HTTPConnection(host, port, timeout=5)
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    response.read()
    return response


def test_cors_answers_an_allowed_origins_preflight_and_marks_its_requests(started):
    cors = {"allowed_origins": ["https://*.example.com"], "allowed_headers": ["X-Tenant"], "max_age": 600}
    receiver, _ = started(protocols={"http": {"endpoint": "127.0.0.1:0", "cors": cors}})
    preflight = _http(receiver, "OPTIONS", "/v1/traces", {"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST",
                                                          "Access-Control-Request-Headers": "X-Tenant, Content-Type"})
    assert preflight.status == 204
    assert preflight.getheader("Access-Control-Allow-Origin") == "https://app.example.com"
    assert preflight.getheader("Access-Control-Allow-Headers") == "X-Tenant, Content-Type" and preflight.getheader("Access-Control-Max-Age") == "600"
    post = _http(receiver, "POST", "/v1/traces", {**PROTOBUF, "Origin": "https://app.example.com"}, sample_data("traces").SerializeToString())
    assert post.status == 200 and post.getheader("Access-Control-Allow-Origin") == "https://app.example.com"
    stranger = _http(receiver, "OPTIONS", "/v1/traces", {"Origin": "https://evil.test", "Access-Control-Request-Method": "POST"})
    assert stranger.getheader("Access-Control-Allow-Origin") is None
    unknown_header = _http(receiver, "OPTIONS", "/v1/traces", {"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST",
                                                               "Access-Control-Request-Headers": "X-Other"})
    assert unknown_header.getheader("Access-Control-Allow-Origin") is None


def test_response_headers_keep_alives_and_compression_algorithms(started):
    import gzip

    http_settings = {"endpoint": "127.0.0.1:0", "response_headers": [{"name": "X-Served-By", "value": "pycollector"}],
                     "keep_alives_enabled": False, "compression_algorithms": ["", "zstd"]}
    receiver, consumer = started(protocols={"http": http_settings})
    body = sample_data("logs").SerializeToString()
    plain = _http(receiver, "POST", "/v1/logs", PROTOBUF, body)
    assert plain.status == 200 and plain.getheader("X-Served-By") == "pycollector" and plain.getheader("Connection") == "close"
    zipped = _http(receiver, "POST", "/v1/logs", {**PROTOBUF, "Content-Encoding": "gzip"}, gzip.compress(body))
    assert zipped.status == 400  # (gzip is not among the algorithms this receiver takes)
    assert len(consumer.messages) == 1


def test_sections_switched_off_with_enabled_false(started):
    receiver, _ = started(protocols={"grpc": {"enabled": False}, "http": {"endpoint": "127.0.0.1:0", "tls": {"enabled": False, "cert_file": "/nowhere"}}})
    assert receiver.grpc_address is None and receiver.http_address is not None
    assert _http(receiver, "POST", "/v1/traces", PROTOBUF, sample_data("traces").SerializeToString()).status == 200


def test_tls_from_inline_pem(started, tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    tls = {"cert_pem": cert.read_text(), "key_pem": key.read_text()}
    receiver, consumer = started(protocols={"http": {"endpoint": "127.0.0.1:0", "tls": tls}, "grpc": {"endpoint": "127.0.0.1:0", "tls": tls}})
    host, port = receiver.http_address
    context = ssl.create_default_context(cafile=str(cert))
    connection = http.client.HTTPSConnection(host, port, context=context, timeout=5)
    connection.request("POST", "/v1/traces", body=sample_data("traces").SerializeToString(), headers=PROTOBUF)
    assert connection.getresponse().status == 200
    credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    grpc_host, grpc_port = receiver.grpc_address
    with grpc.secure_channel(f"{grpc_host}:{grpc_port}", credentials) as channel:
        call = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                   request_serializer=lambda message: message.SerializeToString(), response_deserializer=lambda raw: raw)
        call(sample_data("traces"), timeout=10)
    assert len(consumer.messages) == 2


def test_grpc_keepalive_becomes_grpcs_own_arguments():
    keepalive = KeepaliveServer.model_validate({"server_parameters": {"max_connection_age": "30s", "time": "2h", "timeout": "20s"},
                                                "enforcement_policy": {"min_time": "10s", "permit_without_stream": True}})
    assert dict(grpc_keepalive_options(keepalive)) == {
        "grpc.max_connection_age_ms": 30_000, "grpc.keepalive_time_ms": 7_200_000, "grpc.keepalive_timeout_ms": 20_000,
        "grpc.http2.min_ping_interval_without_data_ms": 10_000, "grpc.keepalive_permit_without_calls": 1}
    assert grpc_keepalive_options(KeepaliveServer.model_validate({"server_parameters": {"enabled": False}})) == []


@pytest.mark.parametrize("protocols, problem", [
    ({"grpc": {"auth": {"authenticator": "basic auth"}}}, 'invalid character\\(s\\) in type "basic auth"'),
    ({"http": {"read_timeout": "5s"}}, "not supported by pycollector: a request is read as long as it takes"),
    ({"http": {"compression_algorithms": ["gzip", "snappy"]}}, "not supported by pycollector: 'snappy'"),
    ({"grpc": {"transport": "udp"}}, "not supported by pycollector: transport 'udp'"),
    ({"grpc": {"tls": {"cert_file": "a", "cert_pem": "b", "key_file": "c"}}}, "cert_file and cert_pem: give one, not both"),
])
def test_what_this_receiver_does_not_do_is_refused_by_name(protocols, problem):
    with pytest.raises(Exception, match=problem):
        factory.config_model.model_validate({"protocols": protocols})


def test_gos_defaults_for_keys_it_does_not_act_on_are_accepted():
    config = factory.config_model.model_validate({"protocols": {"http": {"read_timeout": "0s", "write_timeout": 0, "middlewares": [],
                                                                         "max_request_body_size": 0, "auth": {"enabled": False}}}})
    assert config.protocols.http.max_request_body_size == 20 * 1024 * 1024  # (0 or less: Go's default)
