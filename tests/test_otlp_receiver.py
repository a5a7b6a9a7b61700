"""The otlp receiver on loopback: both protocols, both encodings, bad input, backpressure."""

from __future__ import annotations

import gzip
import io
import tracemalloc
import zlib
from email.message import Message

import grpc
import pytest
import requests
import zstandard
from google.rpc import status_pb2

import pycollector.client
from pycollector.component import PermanentError, RefusedError
from pycollector.otlp import OTLP_SIGNALS, retry_delay, status_from_trailers
from pycollector.otlp.json_codec import to_json
from pycollector.testing import CapturingConsumer, TestHost, make_settings, sample_data
from receivers.otlp.factory import factory
from receivers.otlp.http_body import BodyError, read_body

from tests.test_otlp_support import ClientRecorder, a_profile, export_grpc, sample_tuples

PROTOBUF = {"Content-Type": "application/x-protobuf"}
LOOPBACK = {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}}


class Refusing(CapturingConsumer):
    """A next consumer that raises ``error`` while it is set."""

    def __init__(self, signals=None):
        super().__init__()
        self.error = None
        if signals is not None:
            self.signals = frozenset(signals)

    def consume(self, data):
        if self.error is not None:
            raise self.error
        super().consume(data)


@pytest.fixture
def started():
    receivers = []

    def start(consumer=None, protocols=None):
        consumer = consumer if consumer is not None else Refusing()
        config = factory.config_model.model_validate({"protocols": protocols or LOOPBACK})
        receiver = factory.create(make_settings("receivers", "otlp"), config, consumer)
        receiver.start(TestHost())
        receivers.append(receiver)
        return receiver, consumer

    yield start
    for receiver in receivers:
        receiver.shutdown()


def http_url(receiver, path: str) -> str:
    host, port = receiver.http_address
    return f"http://{host}:{port}{path}"


def grpc_endpoint(receiver) -> str:
    host, port = receiver.grpc_address
    return f"{host}:{port}"


@pytest.mark.parametrize("signal", sorted(OTLP_SIGNALS))
def test_every_signal_arrives_over_grpc_and_http_in_both_encodings(started, signal):
    receiver, consumer = started()
    data = sample_data(signal)
    assert export_grpc(grpc_endpoint(receiver), data) == grpc.StatusCode.OK
    url = http_url(receiver, OTLP_SIGNALS[signal].http_path)
    binary = requests.post(url, data=data.SerializeToString(), headers=PROTOBUF, timeout=5)
    assert (binary.status_code, binary.headers["Content-Type"], binary.content) == (200, "application/x-protobuf", b"")
    as_json = requests.post(url, data=to_json(data), headers={"Content-Type": "application/json"}, timeout=5)
    assert (as_json.status_code, as_json.headers["Content-Type"], as_json.json()) == (200, "application/json", {})
    # Decoded straight into the *Data message pipelines carry, equal to what was sent.
    assert consumer.messages == [data, data, data]


def test_json_ids_are_hex_and_profiles_survive_json(started):
    receiver, consumer = started()
    trace_json = b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"5B8EFFF798038103D269B633813FC60C","spanId":"EEE19B7EC3C1B174","parentSpanId":"","name":"hex","kind":2}]}]}]}'
    response = requests.post(http_url(receiver, "/v1/traces"), data=trace_json, headers={"Content-Type": "application/json; charset=utf-8"}, timeout=5)
    assert response.status_code == 200
    span = consumer.messages[0].resource_spans[0].scope_spans[0].spans[0]
    assert (span.trace_id.hex(), span.span_id.hex(), span.kind) == ("5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174", 2)
    profile = a_profile()
    response = requests.post(http_url(receiver, "/v1development/profiles"), data=to_json(profile), headers={"Content-Type": "application/json"}, timeout=5)
    assert response.status_code == 200
    assert sample_tuples(consumer.messages[1]) == sample_tuples(profile)
    assert consumer.messages[1] == profile


def test_request_bodies_may_be_gzip_deflate_zstd_or_chunked(started):
    receiver, consumer = started()
    body = a_profile().SerializeToString()
    url = http_url(receiver, "/v1development/profiles")
    half = len(body) // 2
    two_zstd_frames = zstandard.compress(body[:half]) + zstandard.compress(body[half:])
    for encoding, compressed in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body)), ("zstd", two_zstd_frames)):
        response = requests.post(url, data=compressed, headers={**PROTOBUF, "Content-Encoding": encoding}, timeout=5)
        assert response.status_code == 200, response.content
    chunks = (body[i : i + 100] for i in range(0, len(body), 100))  # a generator: requests sends it chunked
    assert requests.post(url, data=chunks, headers=PROTOBUF, timeout=5).status_code == 200
    assert [sample_tuples(message) for message in consumer.messages] == [sample_tuples(a_profile())] * 4


def _status(response) -> status_pb2.Status:
    return status_pb2.Status.FromString(response.content)


def test_bad_input_gets_its_status_and_the_receiver_keeps_serving(started):
    receiver, consumer = started(protocols={"http": {"endpoint": "127.0.0.1:0", "max_request_body_size": 4096}})
    url = http_url(receiver, "/v1development/profiles")
    good = a_profile().SerializeToString()
    session = requests.Session()  # keep-alive: a bad request must not spoil the next one

    truncated = session.post(url, data=good[: len(good) // 2], headers=PROTOBUF, timeout=5)
    assert truncated.status_code == 400 and "cannot decode the profiles request" in _status(truncated).message
    assert _status(truncated).code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    bad_json = session.post(url, data=b'{"resourceProfiles": 7}', headers={"Content-Type": "application/json"}, timeout=5)
    assert bad_json.status_code == 400 and bad_json.headers["Content-Type"] == "application/json" and "cannot decode" in bad_json.json()["message"]
    assert session.post(url, data=good, headers={"Content-Type": "text/plain"}, timeout=5).status_code == 415
    assert session.post(url, data=good, timeout=5).status_code == 415  # no Content-Type at all
    assert session.post(url, data=b"\x00" * 5000, headers=PROTOBUF, timeout=5).status_code == 413
    bomb = gzip.compress(b"\x00" * 100_000)  # small on the wire, over the limit once inflated
    assert len(bomb) < 4096 and session.post(url, data=bomb, headers={**PROTOBUF, "Content-Encoding": "gzip"}, timeout=5).status_code == 413
    garbage = session.post(url, data=b"this is not gzip", headers={**PROTOBUF, "Content-Encoding": "gzip"}, timeout=5)
    assert garbage.status_code == 400 and "cannot decompress" in _status(garbage).message
    cut_gzip = session.post(url, data=gzip.compress(good)[:-10], headers={**PROTOBUF, "Content-Encoding": "gzip"}, timeout=5)
    assert cut_gzip.status_code == 400
    zstd_bomb = zstandard.compress(b"\x00" * 100_000)
    assert len(zstd_bomb) < 4096 and session.post(url, data=zstd_bomb, headers={**PROTOBUF, "Content-Encoding": "zstd"}, timeout=5).status_code == 413
    garbage_zstd = session.post(url, data=b"this is not zstd", headers={**PROTOBUF, "Content-Encoding": "zstd"}, timeout=5)
    assert garbage_zstd.status_code == 400 and "cannot decompress the zstd body" in _status(garbage_zstd).message
    cut_zstd = session.post(url, data=zstandard.compress(good)[:-10], headers={**PROTOBUF, "Content-Encoding": "zstd"}, timeout=5)
    assert cut_zstd.status_code == 400 and "truncated" in _status(cut_zstd).message
    brotli = session.post(url, data=good, headers={**PROTOBUF, "Content-Encoding": "br"}, timeout=5)
    assert brotli.status_code == 400 and "this receiver takes: none, gzip, zstd" in _status(brotli).message
    wrong_method = session.get(url, timeout=5)
    assert (wrong_method.status_code, wrong_method.headers["Allow"]) == (405, "POST")
    assert session.post(http_url(receiver, "/v1/nothing"), data=good, headers=PROTOBUF, timeout=5).status_code == 404
    assert consumer.messages == []

    assert session.post(url, data=good, headers=PROTOBUF, timeout=5).status_code == 200
    assert len(consumer.messages) == 1


def test_a_zstd_bomb_is_refused_without_being_inflated():
    bomb = zstandard.compress(b"\x00" * 100_000_000)  # 3 kB that inflate to 100 MB
    headers = Message()
    headers["Content-Length"], headers["Content-Encoding"] = str(len(bomb)), "zstd"
    tracemalloc.start()
    try:
        with pytest.raises(BodyError) as refused:
            read_body(io.BytesIO(bomb), headers, 1_000_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert refused.value.status == 413 and peak < 5_000_000, peak


def test_bad_grpc_input_is_invalid_argument_and_the_server_keeps_serving(started):
    receiver, consumer = started()
    with grpc.insecure_channel(grpc_endpoint(receiver)) as channel:
        raw = channel.unary_unary(OTLP_SIGNALS["profiles"].grpc_method)
        with pytest.raises(grpc.RpcError) as failure:
            raw(a_profile().SerializeToString()[:-7], timeout=5)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert export_grpc(grpc_endpoint(receiver), a_profile()) == grpc.StatusCode.OK
    assert len(consumer.messages) == 1


def test_downstream_refusal_is_retryable_with_its_delay_and_a_permanent_error_is_not(started):
    receiver, consumer = started()
    data = a_profile()
    url = http_url(receiver, "/v1development/profiles")

    consumer.error = RefusedError("memory limit reached", retry_after=2.5)
    refused = requests.post(url, data=data.SerializeToString(), headers=PROTOBUF, timeout=5)
    assert (refused.status_code, refused.headers["Retry-After"]) == (503, "3")
    assert retry_delay(_status(refused)) == 2.5
    with grpc.insecure_channel(grpc_endpoint(receiver)) as channel:
        call = channel.unary_unary(OTLP_SIGNALS["profiles"].grpc_method)
        with pytest.raises(grpc.RpcError) as failure:
            call(data.SerializeToString(), timeout=5)
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
    assert retry_delay(status_from_trailers(failure.value.trailing_metadata())) == 2.5

    consumer.error = RefusedError("busy")
    assert requests.post(url, data=data.SerializeToString(), headers=PROTOBUF, timeout=5).headers["Retry-After"] == "1"

    consumer.error = PermanentError("no pipeline wants this")
    assert requests.post(url, data=data.SerializeToString(), headers=PROTOBUF, timeout=5).status_code == 400
    assert export_grpc(grpc_endpoint(receiver), data) == grpc.StatusCode.INVALID_ARGUMENT

    consumer.error = None
    assert export_grpc(grpc_endpoint(receiver), data) == grpc.StatusCode.OK


def test_only_signals_with_a_pipeline_are_served(started):
    receiver, consumer = started(Refusing(signals={"profiles"}))
    assert export_grpc(grpc_endpoint(receiver), sample_data("traces")) == grpc.StatusCode.UNIMPLEMENTED
    response = requests.post(http_url(receiver, "/v1/traces"), data=sample_data("traces").SerializeToString(), headers=PROTOBUF, timeout=5)
    assert response.status_code == 404
    assert export_grpc(grpc_endpoint(receiver), a_profile()) == grpc.StatusCode.OK


def test_url_paths_are_configurable_like_go(started):
    receiver, consumer = started(protocols={"http": {"endpoint": "127.0.0.1:0", "traces_url_path": "custom/traces"}})
    data = sample_data("traces")
    assert requests.post(http_url(receiver, "/custom/traces"), data=data.SerializeToString(), headers=PROTOBUF, timeout=5).status_code == 200
    assert requests.post(http_url(receiver, "/v1/traces"), data=data.SerializeToString(), headers=PROTOBUF, timeout=5).status_code == 404
    assert receiver.grpc_address is None


def test_config_follows_go(tmp_path):
    model = factory.config_model
    only_grpc = model.model_validate({"protocols": {"grpc": None}})
    assert only_grpc.protocols.http is None and only_grpc.protocols.grpc.endpoint == "localhost:4317"
    assert model.model_validate(only_grpc.model_dump(mode="json")) == only_grpc
    default = model.model_validate({})
    assert (default.protocols.grpc.endpoint, default.protocols.http.endpoint) == ("localhost:4317", "localhost:4318")
    assert default.protocols.http.max_request_body_size == 20 * 1024 * 1024
    for bad in ({"protocols": {}}, {"protocols": {"grpc": {"endpoint": "no-port"}}}, {"protocols": {"http": {"auth": {"authenticator": ""}}}}):
        with pytest.raises(ValueError):
            model.model_validate(bad)


def test_a_port_in_use_is_a_clear_start_error(started):
    receiver, _ = started()
    host, port = receiver.grpc_address
    config = factory.config_model.model_validate({"protocols": {"grpc": {"endpoint": f"{host}:{port}"}}})
    second = factory.create(make_settings("receivers", "otlp/second"), config, CapturingConsumer())
    with pytest.raises(Exception, match="protocols::grpc::endpoint: cannot listen"):
        second.start(TestHost())
    second.shutdown()


@pytest.mark.parametrize("include_metadata", [True, False])
def test_the_client_address_and_with_include_metadata_its_metadata_reach_the_pipeline(started, include_metadata):
    protocols = {name: {**settings, "include_metadata": include_metadata} for name, settings in LOOPBACK.items()}
    receiver, consumer = started(ClientRecorder(), protocols)
    data = sample_data("profiles")
    assert export_grpc(grpc_endpoint(receiver), data, metadata=[("x-tenant", "acme"), ("x-team", "a"), ("x-team", "b")]) == grpc.StatusCode.OK
    response = requests.post(http_url(receiver, "/v1development/profiles"), data=data.SerializeToString(), headers={**PROTOBUF, "X-Tenant": "acme"}, timeout=5)
    assert response.status_code == 200
    by_grpc, by_http = consumer.clients
    assert by_grpc.address == by_http.address == "127.0.0.1"
    if include_metadata:
        assert (by_grpc.get("X-Tenant"), by_grpc.get("x-team")) == (("acme",), ("a", "b"))
        assert by_http.get("x-tenant") == ("acme",) and by_http.get("content-type") == (PROTOBUF["Content-Type"],)
    else:
        assert by_grpc.metadata == by_http.metadata == {}
    assert pycollector.client.current() == pycollector.client.NO_CLIENT  # set only around the call

