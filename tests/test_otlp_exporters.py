"""The otlp_grpc and otlp_http exporters against real backends on loopback, in a running service:
what the backend does (down, throttling, rejecting, slow) and what the exporter counts and logs."""

from __future__ import annotations

import contextlib
import subprocess
import time

import grpc
import pytest
from google.rpc import status_pb2
from structlog.testing import capture_logs

from exporters.otlp_grpc.factory import factory as grpc_factory
from pycollector.component import RefusedError
from pycollector.registry import Registry
from pycollector.testing import CapturingConsumer, TestHost, make_settings
from receivers.otlp.factory import factory as receiver_factory

from tests.test_otlp_support import Answer, GrpcBackend, HttpBackend, a_profile, build_service, component, counter, export_grpc, free_port, sample_tuples

SAMPLES = 3  # per a_profile()
FAST_RETRY = {"initial_interval": "50ms", "randomization_factor": 0, "max_interval": "200ms", "max_elapsed_time": "10s"}
LONG_RETRY = {"initial_interval": "30s", "max_interval": "30s", "max_elapsed_time": "5m"}


def backend_settings(exporter: str, endpoint: str, **settings) -> dict:
    if exporter == "otlp_grpc":
        return {"endpoint": endpoint, "tls": {"insecure": True}, **settings}
    return {"endpoint": endpoint, **settings}


@contextlib.contextmanager
def running(exporter: str, settings: dict):
    """otlp receiver (gRPC) -> ``exporter``: yields (service, where to send, exporter labels)."""
    service = build_service(
        {
            "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}},
            "exporters": {exporter: settings},
            "service": {"pipelines": {"profiles": {"receivers": ["otlp"], "exporters": [exporter]}}},
        }
    )
    service.start()
    try:
        host, port = component(service, "receivers", "otlp").grpc_address
        yield service, f"{host}:{port}", {"exporter": exporter}
    finally:
        service.shutdown()


def sent(service, labels) -> float:
    return counter(service, "otelcol_exporter_sent_profile_samples_total", labels)


def failed(service, labels) -> float:
    return counter(service, "otelcol_exporter_send_failed_profile_samples_total", labels)


def wait_for(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("exporter, backend_type", [("otlp_grpc", GrpcBackend), ("otlp_http", HttpBackend)])
def test_backend_down_then_up_within_the_retry_window_loses_nothing(exporter, backend_type):
    port = free_port()
    endpoint = f"127.0.0.1:{port}" if exporter == "otlp_grpc" else f"http://127.0.0.1:{port}"
    with running(exporter, backend_settings(exporter, endpoint, retry_on_failure=FAST_RETRY)) as (service, receiver, labels):
        sent_profiles = [a_profile(pid=pid) for pid in (1, 2, 3)]
        for profile in sent_profiles:
            assert export_grpc(receiver, profile) == grpc.StatusCode.OK  # queued: the client is done
        time.sleep(0.5)  # every request fails and backs off meanwhile
        with backend_type(port=port) as backend:
            assert backend.wait_for(lambda b: len(b.messages) == 3), "the queued requests never arrived"
            assert wait_for(lambda: sent(service, labels) == 3 * SAMPLES)
        assert sorted(map(sample_tuples, backend.of("profiles")), key=repr) == sorted(map(sample_tuples, sent_profiles), key=repr)
        assert failed(service, labels) == 0


@pytest.mark.parametrize("compression, content_encoding", [("zstd", "zstd"), ("gzip", "gzip"), ("none", None)])
def test_otlp_http_compresses_as_configured(compression, content_encoding):
    with HttpBackend() as backend, running("otlp_http", backend_settings("otlp_http", backend.endpoint, compression=compression)) as (service, receiver, labels):
        export_grpc(receiver, a_profile())
        assert backend.wait_for(lambda b: len(b.messages) == 1), "the profile never arrived"
    assert backend.content_encodings == [content_encoding]
    assert sample_tuples(backend.messages[0]) == sample_tuples(a_profile())


def test_http_503_retry_after_is_honoured():
    script = [Answer(status=503, headers={"Retry-After": "1"}), Answer()]
    with HttpBackend(script) as backend, running("otlp_http", backend_settings("otlp_http", backend.endpoint, retry_on_failure=FAST_RETRY)) as (service, receiver, labels):
        export_grpc(receiver, a_profile())
        waited = backend.retry_wait()
        print(f"Retry-After: 1 -> the exporter waited {waited:.3f}s (its own backoff was 50ms)")
        assert 1.0 <= waited < 1.5
        assert wait_for(lambda: sent(service, labels) == SAMPLES)


def test_grpc_resource_exhausted_is_retried_after_its_retry_info_and_dropped_without_one():
    script = [Answer(code=grpc.StatusCode.RESOURCE_EXHAUSTED, retry_after=0.8), Answer(), Answer(code=grpc.StatusCode.RESOURCE_EXHAUSTED)]
    with GrpcBackend(script) as backend, running("otlp_grpc", backend_settings("otlp_grpc", backend.endpoint, retry_on_failure=FAST_RETRY)) as (service, receiver, labels):
        export_grpc(receiver, a_profile())
        waited = backend.retry_wait()
        print(f"RetryInfo 0.8s -> the exporter waited {waited:.3f}s")
        assert 0.8 <= waited < 1.3
        export_grpc(receiver, a_profile())
        assert wait_for(lambda: failed(service, labels) == SAMPLES)
        time.sleep(0.3)
        assert len(backend.attempt_times) == 3, "RESOURCE_EXHAUSTED without RetryInfo must not be retried"


def test_http_400_is_dropped_counted_and_logged_once():
    body = status_pb2.Status(code=3, message="profile has no sample type").SerializeToString()
    script = [Answer(status=400, headers={"Content-Type": "application/x-protobuf"}, body=body)]
    with capture_logs() as logged, HttpBackend(script) as backend:
        with running("otlp_http", backend_settings("otlp_http", backend.endpoint, retry_on_failure=FAST_RETRY)) as (service, receiver, labels):
            export_grpc(receiver, a_profile())
            assert wait_for(lambda: failed(service, labels) == SAMPLES)
            time.sleep(0.3)
            assert len(backend.attempt_times) == 1, "a 400 must not be retried"
            assert sent(service, labels) == 0
    drops = [entry for entry in logged if entry["event"] == "exporting failed; dropping data"]
    assert len(drops) == 1, drops
    assert drops[0]["items"] == SAMPLES and "HTTP 400" in drops[0]["error"] and "profile has no sample type" in drops[0]["error"]


def test_a_slow_backend_fills_the_queue_and_what_did_not_fit_is_counted():
    queue = {"num_consumers": 1, "queue_size": 2}
    with GrpcBackend() as backend, running("otlp_grpc", backend_settings("otlp_grpc", backend.endpoint, sending_queue=queue, timeout="30s")) as (service, receiver, labels):
        backend.gate.clear()  # the backend holds every request until the gate opens
        assert export_grpc(receiver, a_profile()) == grpc.StatusCode.OK
        assert backend.wait_for(lambda b: b.in_flight == 1)  # the only consumer is now busy
        answers = [export_grpc(receiver, a_profile()) for _ in range(9)]
        assert answers == [grpc.StatusCode.OK] * 2 + [grpc.StatusCode.UNAVAILABLE] * 7  # refused: the client may retry
        enqueue_failed = counter(service, "otelcol_exporter_enqueue_failed_profile_samples_total", labels)
        print(f"enqueue_failed_profile_samples = {enqueue_failed:g} (7 requests of {SAMPLES} samples)")
        assert enqueue_failed == 7 * SAMPLES
        assert counter(service, "otelcol_receiver_refused_profile_samples_total", {"receiver": "otlp"}) == 7 * SAMPLES
        assert service.telemetry.sample("otelcol_exporter_queue_size", labels) == 2
        assert service.telemetry.sample("otelcol_exporter_queue_capacity", labels) == 2
        backend.gate.set()
        assert wait_for(lambda: sent(service, labels) == 3 * SAMPLES)
        assert failed(service, labels) == 0


def test_shutdown_during_a_long_backoff_returns_at_once_and_counts_the_loss():
    with GrpcBackend([Answer(code=grpc.StatusCode.UNAVAILABLE)]) as backend:
        with running("otlp_grpc", backend_settings("otlp_grpc", backend.endpoint, retry_on_failure=LONG_RETRY)) as (service, receiver, labels):
            export_grpc(receiver, a_profile())
            assert backend.wait_for(lambda b: len(b.attempt_times) == 1)
            time.sleep(0.2)  # now in a backoff of about 30 s
            began = time.monotonic()
            service.shutdown()
            took = time.monotonic() - began
            print(f"shutdown during a 30s backoff took {took:.3f}s")
            assert took < 10.0  # (not the backoff's 30 s; how fast on a loaded host is no check of this)
            assert failed(service, labels) == SAMPLES


def test_partial_success_is_logged_with_its_rejected_count():
    with capture_logs() as logged, GrpcBackend([Answer(rejected=2)]) as backend:
        with running("otlp_grpc", backend_settings("otlp_grpc", backend.endpoint)) as (service, receiver, labels):
            export_grpc(receiver, a_profile())
            assert wait_for(lambda: sent(service, labels) == SAMPLES)
    [partial] = [entry for entry in logged if entry["event"] == "partial success: the backend rejected items"]
    assert (partial["items"], partial["message"], partial["signal"]) == (2, "scripted partial success", "profiles")


def test_without_a_queue_the_outcome_reaches_the_sender():
    script = [Answer(status=503), Answer(status=400)]
    settings = {"sending_queue": {"enabled": False}, "retry_on_failure": {"enabled": False}}
    with HttpBackend(script) as backend, running("otlp_http", backend_settings("otlp_http", backend.endpoint, **settings)) as (service, receiver, labels):
        assert export_grpc(receiver, a_profile()) == grpc.StatusCode.UNAVAILABLE
        assert export_grpc(receiver, a_profile()) == grpc.StatusCode.INVALID_ARGUMENT
        assert failed(service, labels) == 2 * SAMPLES


def self_signed(folder, name: str) -> tuple[str, str]:
    """A self-signed certificate (its own CA) for ``name``, and its key."""
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
         "-subj", f"/CN={name}", "-addext", f"subjectAltName=DNS:{name}", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return str(cert), str(key)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """The server's certificate for the name otlp.test (the tests dial 127.0.0.1 and override it)."""
    return self_signed(tmp_path_factory.mktemp("tls"), "otlp.test")


@pytest.fixture(scope="module")
def client_certificate(tmp_path_factory):
    return self_signed(tmp_path_factory.mktemp("client-tls"), "agent.otlp.test")


@pytest.mark.parametrize("form", ["file", "pem"])
@pytest.mark.parametrize("mutual", [False, True], ids=["server-tls", "mutual-tls"])
@pytest.mark.parametrize("exporter", ["otlp_grpc", "otlp_http"])
def test_tls_with_a_private_ca_and_server_name_override(certificate, client_certificate, exporter, mutual, form):
    cert, key = certificate
    tls = {"cert_file": cert, "key_file": key, **({"client_ca_file": client_certificate[0]} if mutual else {})}
    config = receiver_factory.config_model.model_validate({"protocols": {"grpc": {"endpoint": "127.0.0.1:0", "tls": tls}, "http": {"endpoint": "127.0.0.1:0", "tls": tls}}})
    consumer = CapturingConsumer()
    receiver = receiver_factory.create(make_settings("receivers", "otlp"), config, consumer)
    receiver.start(TestHost())
    try:
        address = receiver.grpc_address if exporter == "otlp_grpc" else receiver.http_address
        endpoint = "{}:{}".format(*address) if exporter == "otlp_grpc" else "https://{}:{}".format(*address)
        exporter_factory = Registry().load("exporters", exporter).factory

        def as_given(tls: dict) -> dict:
            """Files as named, or their contents inline (Go's *_pem keys)."""
            if form == "file":
                return tls
            return {key.replace("_file", "_pem"): open(path).read() for key, path in tls.items()}

        def send(client_tls: dict) -> None:
            tls = {**as_given({"ca_file": cert, **client_tls}), "server_name_override": "otlp.test"}
            settings = exporter_factory.config_model.model_validate({"endpoint": endpoint, "tls": tls, "retry_on_failure": {"enabled": False}, "sending_queue": {"enabled": False}})
            instance = exporter_factory.create(make_settings("exporters", exporter), settings, None)
            instance.start(TestHost())
            try:
                instance.consume(a_profile())
            finally:
                instance.shutdown()

        if mutual:
            with pytest.raises(RefusedError):  # the server asks for a certificate this client lacks
                send({})
            assert consumer.messages == []
            client_cert, client_key = client_certificate
            send({"cert_file": client_cert, "key_file": client_key})
        else:
            send({})
        assert consumer.wait_for(lambda c: len(c.messages) == 1, timeout=10)
    finally:
        receiver.shutdown()
    assert sample_tuples(consumer.messages[0]) == sample_tuples(a_profile())


def test_grpc_insecure_skip_verify_is_refused_by_name_not_ignored():
    with pytest.raises(ValueError, match="tls::insecure_skip_verify: not supported by pycollector: grpcio always verifies"):
        grpc_factory.config_model.model_validate({"tls": {"insecure_skip_verify": True}})


def test_grpc_client_keys_become_grpcs_own_arguments():
    config = grpc_factory.config_model.model_validate({"endpoint": "backend:4317", "user_agent": "agent/1", "read_buffer_size": 65536,
                                                       "keepalive": {"time": "30s", "timeout": "5s", "permit_without_stream": True}})
    options = dict(config.grpc_options())
    assert options["grpc.primary_user_agent"] == "agent/1" and options["grpc.experimental.tcp_read_chunk_size"] == 65536
    assert (options["grpc.keepalive_time_ms"], options["grpc.keepalive_timeout_ms"], options["grpc.keepalive_permit_without_calls"]) == (30000, 5000, 1)
    assert options["grpc.http2.write_buffer_size"] == 512 * 1024  # (Go's default)
    off = grpc_factory.config_model.model_validate({"endpoint": "backend:4317", "keepalive": {"enabled": False}})
    assert "grpc.keepalive_time_ms" not in dict(off.grpc_options())


def test_otlp_http_through_a_proxy_with_cookies_keep_alive_off_and_a_compression_level():
    """The backend stands in for the proxy too: a request through a proxy names the whole URL."""
    cookie = Answer(headers={"Set-Cookie": "route=b2; Path=/"})
    for cookies, expect_cookie in (({}, True), (None, False)):
        with HttpBackend([cookie, Answer()]) as proxy:
            settings = {"endpoint": "http://otlp-gateway.invalid:4318", "proxy_url": proxy.endpoint, "disable_keep_alives": True,
                        "compression": "zstd", "compression_params": {"level": 19}, "retry_on_failure": {"enabled": False},
                        "sending_queue": {"enabled": False}, **({"cookies": cookies} if cookies is not None else {})}
            config = Registry().load("exporters", "otlp_http").factory.config_model.model_validate(settings)
            exporter = Registry().load("exporters", "otlp_http").factory.create(make_settings("exporters", "otlp_http"), config, None)
            exporter.start(TestHost())
            try:
                exporter.consume(a_profile())
                exporter.consume(a_profile())
            finally:
                exporter.shutdown()
            assert proxy.request_targets == ["http://otlp-gateway.invalid:4318/v1development/profiles"] * 2
            assert proxy.content_encodings == ["zstd", "zstd"] and all(headers.get("Connection") == "close" for headers in proxy.request_headers)
            assert ("route=b2" in proxy.request_headers[1].get("Cookie", "")) is expect_cookie, proxy.request_headers[1]


@pytest.mark.parametrize("exporter", ["otlp_grpc", "otlp_http"])
def test_sending_queue_batch_merges_what_waits_into_one_request(exporter):
    """Go's exporter-side batching: requests queued while a batch gathers go out as one, up to
    min_size samples; a batch that never reaches min_size leaves at flush_timeout."""
    from pycollector.pdata import sample_count

    backend_type = GrpcBackend if exporter == "otlp_grpc" else HttpBackend
    with backend_type() as backend:
        queue = {"num_consumers": 4, "batch": {"min_size": 3 * SAMPLES, "flush_timeout": "5s"}}
        settings = backend_settings(exporter, backend.endpoint, sending_queue=queue, retry_on_failure={"enabled": False})
        config = Registry().load("exporters", exporter).factory.config_model.model_validate(settings)
        instance = Registry().load("exporters", exporter).factory.create(make_settings("exporters", exporter), config, None)
        instance.start(TestHost())
        try:
            for _ in range(3):
                instance.consume(a_profile())
            assert backend.wait_for(lambda b: len(b.messages) >= 1, timeout=10)
            time.sleep(0.3)
            assert [sample_count(message) for message in backend.messages] == [3 * SAMPLES]
            assert sample_tuples(backend.messages[0]) == sample_tuples(a_profile()) * 3
            began = time.monotonic()
            instance.consume(a_profile())  # alone: it waits for flush_timeout, then goes
            assert backend.wait_for(lambda b: len(b.messages) == 2, timeout=10)
            assert time.monotonic() - began >= 4  # (not before flush_timeout)
        finally:
            instance.shutdown()
